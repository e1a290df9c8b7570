package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/podjanitor/podjanitor/policy"
)

func policyWithAfter(after string) []byte {
	return []byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n" +
		"  - name: r\n    clock: created\n    after: " + after + "\n")
}

// startPolicyWatch loads the policy file as the daemon does at start, lets
// between run (the moment between that read and the watcher's start), and
// starts the watcher; reloads arrive on the channel.
func startPolicyWatch(t *testing.T, path string, between func()) (*policy.Evaluator, <-chan *policy.Evaluator) {
	t.Helper()
	e, data, err := loadEvaluator(path, "podjanitor.io")
	if err != nil {
		t.Fatal(err)
	}
	between()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	reloads := make(chan *policy.Evaluator, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchPolicyFile(ctx, path, data, policyEvaluator("podjanitor.io"), func(e *policy.Evaluator, err error) {
			if err != nil {
				t.Errorf("reload: %v", err)
				return
			}
			reloads <- e
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return e, reloads
}

// A change to the policy file after the daemon read it at start, before the
// watcher's first read, is applied: the watcher compares with the bytes the
// running policy was made from, not with a second read of its own (which took
// the changed file for the running policy, so it was never applied).
func TestPolicyChangedAfterTheStartReadIsApplied(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, policyWithAfter("1h"), 0o644); err != nil {
		t.Fatal(err)
	}
	running, reloads := startPolicyWatch(t, path, func() {
		if err := os.WriteFile(path, policyWithAfter("2h"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if got := running.Policy.Rules[0].After; got != time.Hour {
		t.Fatalf("the start's policy has after %v, want 1h", got)
	}
	select {
	case e := <-reloads:
		if got := e.Policy.Rules[0].After; got != 2*time.Hour {
			t.Errorf("reloaded policy has after %v, want the changed file's 2h", got)
		}
	case <-time.After(10*policyPollInterval + 10*time.Second):
		t.Fatal("the policy file changed after the start's read was never reloaded")
	}
}

// An unchanged file is not reloaded: the start's bytes are the running policy.
func TestPolicyUnchangedSinceTheStartIsNotReloaded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, policyWithAfter("1h"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, reloads := startPolicyWatch(t, path, func() {})
	select {
	case e := <-reloads:
		t.Errorf("reloaded an unchanged policy file (after %v)", e.Policy.Rules[0].After)
	case <-time.After(2*policyPollInterval + time.Second):
	}
}
