package main

import (
	"bytes"
	"context"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/policy"
)

// policyPollInterval is how often the policy file is read for changes. A
// ConfigMap volume is updated by swapping a symlink, which this sees as well.
const policyPollInterval = 2 * time.Second

// watchPolicyFile reads the policy file at path for changes until ctx ends.
// loaded is the content the running policy was made from (loadEvaluator
// read it once): a change is a difference from those bytes, so a file changed
// after they were read is applied at the first poll, not taken for the
// running policy. Each changed content is made into an evaluator by
// newEvaluator and handed to reloaded; a file that cannot be read or does not
// validate is rejected: reloaded gets the error, and the running policy stays.
func watchPolicyFile(ctx context.Context, path string, loaded []byte, newEvaluator func([]byte) (*policy.Evaluator, error),
	reloaded func(*policy.Evaluator, error)) {
	logger := klog.FromContext(ctx).WithValues("config", path)
	last := loaded
	ticker := time.NewTicker(policyPollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		data, err := os.ReadFile(path)
		if err != nil {
			logger.Error(err, "Cannot read the policy file, keeping the running policy")
			reloaded(nil, err)
			continue
		}
		if bytes.Equal(data, last) {
			continue
		}
		last = data
		e, err := newEvaluator(data)
		if err != nil {
			logger.Error(err, "Rejected the changed policy file, keeping the running policy")
			reloaded(nil, err)
			continue
		}
		reloaded(e, nil)
		logger.Info("Reloaded the policy file; deciding every pod again", "rules", len(e.Policy.Rules))
	}
}
