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

// watchPolicyFile reloads the policy file when its content changes. A file
// that does not validate is rejected and the running policy stays.
func watchPolicyFile(ctx context.Context, o *options, c *Controller) {
	logger := klog.FromContext(ctx).WithValues("config", o.configFile)
	last, _ := os.ReadFile(o.configFile)
	ticker := time.NewTicker(policyPollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		data, err := os.ReadFile(o.configFile)
		if err != nil {
			logger.Error(err, "Cannot read the policy file, keeping the running policy")
			c.metrics.policyReloaded(false)
			continue
		}
		if bytes.Equal(data, last) {
			continue
		}
		last = data
		p, err := policy.Parse(data)
		if err != nil {
			logger.Error(err, "Rejected the changed policy file, keeping the running policy")
			c.metrics.policyReloaded(false)
			continue
		}
		if err := c.SetEvaluator(&policy.Evaluator{Prefix: o.annotationPrefix, Policy: p}); err != nil {
			logger.Error(err, "Re-evaluating pods after a policy reload")
		}
		c.metrics.policyReloaded(true)
		logger.Info("Reloaded the policy file; deciding every pod again", "rules", len(p.Rules))
	}
}
