package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// ruleDecision is what a rule named name with clock and action decides at deadline.
func ruleDecision(name string, clock Clock, action Action, deadline time.Time) Decision {
	return Decision{Deadline: deadline, Action: action, Source: "rule/" + name, Reason: clockReasons[clock], Rule: name}
}

func TestDecideRules(t *testing.T) {
	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	maxAge := Rule{Name: "max-age", Clock: ClockCreated, After: time.Hour}
	tests := []struct {
		name  string
		rules []Rule
		pod   *corev1.Pod
		want  Decision
	}{
		// Clocks.
		{
			name:  "finished: evicted pod without container statuses",
			rules: []Rule{{Name: "evicted", Match: Match{Reasons: []string{"Evicted"}}, Clock: ClockFinished, After: time.Hour}},
			pod: newPod(inPhase(corev1.PodFailed), withReason("Evicted"),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "TerminationByKubelet", at(30))),
			want: ruleDecision("evicted", ClockFinished, ActionDelete, at(90)),
		},
		{
			name:  "finished: does not apply to a running pod",
			rules: []Rule{{Name: "finished", Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodRunning)),
			want:  Decision{},
		},
		{
			name:  "finished: a finish time in the future counts from now",
			rules: []Rule{{Name: "finished", Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodSucceeded), withContainers(terminatedContainer("Completed", now.Add(time.Hour)))),
			want: func() Decision {
				d := ruleDecision("finished", ClockFinished, ActionDelete, now.Add(time.Hour))
				d.ClockSkew = true
				return d
			}(),
		},
		{
			name:  "pending: from the PodScheduled=False transition",
			rules: []Rule{{Name: "unschedulable", Clock: ClockPending, After: 30 * time.Minute}},
			pod:   newPod(withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", at(5))),
			want:  ruleDecision("unschedulable", ClockPending, ActionDelete, at(35)),
		},
		{
			name:  "pending: scheduled and stuck in ImagePullBackOff counts from the PodScheduled=True transition",
			rules: []Rule{{Name: "unschedulable", Clock: ClockPending, After: 30 * time.Minute}},
			pod: newPod(withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", at(5)),
				withContainers(waitingContainer("ImagePullBackOff", 0))),
			want: ruleDecision("unschedulable", ClockPending, ActionDelete, at(35)),
		},
		{
			name:  "pending: does not apply to a running pod",
			rules: []Rule{{Name: "unschedulable", Clock: ClockPending, After: 30 * time.Minute}},
			pod:   newPod(inPhase(corev1.PodRunning)),
			want:  Decision{},
		},
		{
			name:  "pending: a transition in the future counts from now",
			rules: []Rule{{Name: "unschedulable", Clock: ClockPending, After: 30 * time.Minute}},
			pod:   newPod(withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", now.Add(time.Minute))),
			want: func() Decision {
				d := ruleDecision("unschedulable", ClockPending, ActionDelete, now.Add(30*time.Minute))
				d.ClockSkew = true
				return d
			}(),
		},
		{
			name:  "crashLooping: from the Ready=False transition, evicted",
			rules: []Rule{{Name: "crash", Clock: ClockCrashLooping, After: 20 * time.Minute}},
			pod: newPod(inPhase(corev1.PodRunning), withContainers(runningContainer(), waitingContainer("CrashLoopBackOff", 3)),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", at(10))),
			want: ruleDecision("crash", ClockCrashLooping, ActionEvict, at(30)),
		},
		{
			name:  "crashLooping: without a Ready=False condition counts from creation",
			rules: []Rule{{Name: "crash", Clock: ClockCrashLooping, After: 20 * time.Minute}},
			pod: newPod(inPhase(corev1.PodRunning), withContainers(waitingContainer("CrashLoopBackOff", 3)),
				withCondition(corev1.PodReady, corev1.ConditionTrue, "", at(10))),
			want: ruleDecision("crash", ClockCrashLooping, ActionEvict, at(20)),
		},
		{
			name:  "crashLooping: init container crash loop on a pending pod is deleted",
			rules: []Rule{{Name: "crash", Clock: ClockCrashLooping, After: 20 * time.Minute, MinRestarts: 2}},
			pod: newPod(withInitContainers(waitingContainer("CrashLoopBackOff", 2)), withContainers(waitingContainer("PodInitializing", 0)),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", at(1))),
			want: ruleDecision("crash", ClockCrashLooping, ActionDelete, at(21)),
		},
		{
			name:  "crashLooping: fewer restarts than minRestarts",
			rules: []Rule{{Name: "crash", Clock: ClockCrashLooping, After: 20 * time.Minute, MinRestarts: 5}},
			pod:   newPod(inPhase(corev1.PodRunning), withContainers(waitingContainer("CrashLoopBackOff", 4), waitingContainer("ImagePullBackOff", 9))),
			want:  Decision{},
		},
		{
			name:  "crashLooping: restarts without a crash loop",
			rules: []Rule{{Name: "crash", Clock: ClockCrashLooping, After: 20 * time.Minute}},
			pod:   newPod(inPhase(corev1.PodRunning), withContainers(corev1.ContainerStatus{Name: "c", RestartCount: 9})),
			want:  Decision{},
		},
		{
			name:  "created: a pod without creationTimestamp has no age",
			rules: []Rule{{Name: "max-age", Clock: ClockCreated, After: 0}},
			pod:   newPod(inPhase(corev1.PodRunning), notCreated()),
			want:  Decision{},
		},
		{
			name:  "crashLooping: without a Ready=False condition or creationTimestamp does not apply",
			rules: []Rule{{Name: "crash", Clock: ClockCrashLooping, After: 20 * time.Minute}},
			pod:   newPod(inPhase(corev1.PodRunning), notCreated(), withContainers(waitingContainer("CrashLoopBackOff", 3))),
			want:  Decision{},
		},
		{
			name:  "created: maximum age, any phase",
			rules: []Rule{{Name: "max-age", Clock: ClockCreated, After: 7 * 24 * time.Hour}},
			pod:   newPod(inPhase(corev1.PodRunning)),
			want:  ruleDecision("max-age", ClockCreated, ActionEvict, created.Add(7*24*time.Hour)),
		},

		// Namespaces.
		{
			name:  "namespaces: exact include",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Include: []string{"team-a"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("team-a")),
			want:  ruleDecision("r", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "namespaces: not included",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Include: []string{"team-a"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("team-ab")),
			want:  Decision{},
		},
		{
			name:  "namespaces: glob include",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Include: []string{"ci-*"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("ci-1234")),
			want:  ruleDecision("r", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "namespaces: exclude beats include",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Include: []string{"ci-*"}, Exclude: []string{"ci-keep-?"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("ci-keep-1")),
			want:  Decision{},
		},
		{
			name:  "namespaces: exclude without include",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Exclude: []string{"*-prod"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("shop-prod")),
			want:  Decision{},
		},
		{
			name:  "kube-system: excluded by default",
			rules: []Rule{maxAge},
			pod:   newPod(inNamespace("kube-system")),
			want:  Decision{},
		},
		{
			name:  "kube-system: a glob does not name it",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Include: []string{"kube-*", "*"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("kube-system")),
			want:  Decision{},
		},
		{
			name:  "kube-system: named exactly",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Include: []string{"kube-system"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("kube-system")),
			want:  ruleDecision("r", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "kube-public is not protected",
			rules: []Rule{maxAge},
			pod:   newPod(inNamespace("kube-public")),
			want:  ruleDecision("max-age", ClockCreated, ActionDelete, at(60)),
		},

		// Labels.
		{
			name:  "labelSelector: matches",
			rules: []Rule{{Name: "r", Match: Match{LabelSelector: "app=web,env in (ci,dev),!pinned"}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(labelled("app", "web", "env", "ci")),
			want:  ruleDecision("r", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "labelSelector: does not match",
			rules: []Rule{{Name: "r", Match: Match{LabelSelector: "app=web,env in (ci,dev),!pinned"}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(labelled("app", "web", "env", "ci", "pinned", "")),
			want:  Decision{},
		},

		// Owners.
		{
			name:  "ownerKinds: include ReplicaSet",
			rules: []Rule{{Name: "r", Match: Match{OwnerKinds: IncludeExclude{Include: []string{"ReplicaSet"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(ownedBy("ReplicaSet")),
			want:  ruleDecision("r", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "ownerKinds: a bare pod is not owned by a ReplicaSet",
			rules: []Rule{{Name: "r", Match: Match{OwnerKinds: IncludeExclude{Include: []string{"ReplicaSet"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(),
			want:  Decision{},
		},
		{
			name:  "ownerKinds: <none> matches a bare pod",
			rules: []Rule{{Name: "r", Match: Match{OwnerKinds: IncludeExclude{Include: []string{NoOwner}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(),
			want:  ruleDecision("r", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "ownerKinds: <none> does not match an owned pod",
			rules: []Rule{{Name: "r", Match: Match{OwnerKinds: IncludeExclude{Include: []string{NoOwner}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(ownedBy("Job")),
			want:  Decision{},
		},
		{
			name:  "ownerKinds: several owners, one included",
			rules: []Rule{{Name: "r", Match: Match{OwnerKinds: IncludeExclude{Include: []string{"TaskRun"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(ownedBy("Workflow", "TaskRun")),
			want:  ruleDecision("r", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "ownerKinds: several owners, one excluded",
			rules: []Rule{{Name: "r", Match: Match{OwnerKinds: IncludeExclude{Include: []string{"TaskRun"}, Exclude: []string{"StatefulSet"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(ownedBy("TaskRun", "StatefulSet")),
			want:  Decision{},
		},
		{
			name:  "ownerKinds: exclude <none> keeps bare pods",
			rules: []Rule{{Name: "r", Match: Match{OwnerKinds: IncludeExclude{Exclude: []string{NoOwner}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(),
			want:  Decision{},
		},

		// Phases.
		{
			name:  "phases: listed",
			rules: []Rule{{Name: "r", Match: Match{Phases: []corev1.PodPhase{corev1.PodFailed, corev1.PodSucceeded}}, Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodSucceeded), startedAt(at(1))),
			want:  ruleDecision("r", ClockFinished, ActionDelete, at(61)),
		},
		{
			name:  "phases: not listed",
			rules: []Rule{{Name: "r", Match: Match{Phases: []corev1.PodPhase{corev1.PodFailed}}, Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodSucceeded)),
			want:  Decision{},
		},

		// Reasons.
		{
			name:  "reasons: pod status.reason",
			rules: []Rule{{Name: "r", Match: Match{Reasons: []string{"Evicted"}}, Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodFailed), withReason("Evicted")),
			want:  ruleDecision("r", ClockFinished, ActionDelete, at(60)),
		},
		{
			name:  "reasons: a container terminated reason",
			rules: []Rule{{Name: "r", Match: Match{Reasons: []string{"OOMKilled"}}, Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodFailed), withContainers(terminatedContainer("Completed", at(1)), terminatedContainer("OOMKilled", at(2)))),
			want:  ruleDecision("r", ClockFinished, ActionDelete, at(62)),
		},
		{
			name:  "reasons: an init container terminated reason",
			rules: []Rule{{Name: "r", Match: Match{Reasons: []string{"Error"}}, Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodFailed), withInitContainers(terminatedContainer("Error", at(3)))),
			want:  ruleDecision("r", ClockFinished, ActionDelete, at(63)),
		},
		{
			name:  "reasons: a container waiting reason",
			rules: []Rule{{Name: "r", Match: Match{Reasons: []string{"CrashLoopBackOff"}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodRunning), withContainers(waitingContainer("CrashLoopBackOff", 1))),
			want:  ruleDecision("r", ClockCreated, ActionEvict, at(60)),
		},
		{
			name:  "reasons: none present",
			rules: []Rule{{Name: "r", Match: Match{Reasons: []string{"Evicted", "OOMKilled"}}, Clock: ClockFinished, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodFailed), withContainers(terminatedContainer("Error", at(1)))),
			want:  Decision{},
		},

		// Order, action, grace period.
		{
			name: "first matching rule decides, even with a later deadline",
			rules: []Rule{
				{Name: "first", Clock: ClockCreated, After: 2 * time.Hour},
				{Name: "second", Clock: ClockCreated, After: time.Hour},
			},
			pod:  newPod(),
			want: ruleDecision("first", ClockCreated, ActionDelete, at(120)),
		},
		{
			name: "a rule whose match fails is passed over",
			rules: []Rule{
				{Name: "other-ns", Match: Match{Namespaces: IncludeExclude{Include: []string{"other"}}}, Clock: ClockCreated, After: time.Minute},
				maxAge,
			},
			pod:  newPod(),
			want: ruleDecision("max-age", ClockCreated, ActionDelete, at(60)),
		},
		{
			name: "a rule whose clock does not apply is passed over",
			rules: []Rule{
				{Name: "finished", Clock: ClockFinished, After: time.Minute},
				maxAge,
			},
			pod:  newPod(inPhase(corev1.PodRunning)),
			want: ruleDecision("max-age", ClockCreated, ActionEvict, at(60)),
		},
		{
			name:  "action and grace period from the rule",
			rules: []Rule{{Name: "r", Clock: ClockCreated, After: time.Hour, Action: ActionDelete, GracePeriodSeconds: ptr[int64](5)}},
			pod:   newPod(inPhase(corev1.PodRunning)),
			want: func() Decision {
				d := ruleDecision("r", ClockCreated, ActionDelete, at(60))
				d.GracePeriodSeconds = ptr[int64](5)
				return d
			}(),
		},

		// Annotations and out-of-scope pods.
		{
			name:  "an annotation overrides the rules",
			rules: []Rule{maxAge},
			pod:   newPod(annotated(keyTTL, "1w")),
			want:  Decision{Deadline: created.Add(7 * 24 * time.Hour), Action: ActionDelete, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name:  "a deadline annotation that does not apply yet still overrides the rules",
			rules: []Rule{maxAge},
			pod:   newPod(inPhase(corev1.PodRunning), annotated(keyTTLAfterFinished, "1h")),
			want:  Decision{},
		},
		{
			name:  "keep false does not override the rules",
			rules: []Rule{maxAge},
			pod:   newPod(annotated(keyKeep, "false")),
			want:  ruleDecision("max-age", ClockCreated, ActionDelete, at(60)),
		},
		{
			name:  "keep vetoes the rules",
			rules: []Rule{maxAge},
			pod:   newPod(annotated(keyKeep, "true")),
			want:  Decision{Kept: true},
		},
		{
			name:  "mirror pods are never matched",
			rules: []Rule{{Name: "r", Match: Match{Namespaces: IncludeExclude{Include: []string{"kube-system"}}}, Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inNamespace("kube-system"), mirror()),
			want:  Decision{Skipped: SkippedMirrorPod},
		},
		{
			name:  "terminating pods are never matched",
			rules: []Rule{maxAge},
			pod:   newPod(terminating()),
			want:  Decision{Skipped: SkippedTerminating},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Evaluator{Policy: mustPolicy(t, tt.rules...)}
			got, err := e.Decide(tt.pod, anyNamespace, now)
			if err != nil {
				t.Fatalf("Decide() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestDecidePolicyLiteral(t *testing.T) {
	// A Policy built without NewPolicy still works; a bad selector matches nothing.
	e := &Evaluator{Policy: &Policy{Rules: []Rule{
		{Name: "bad", Match: Match{LabelSelector: "a=(("}, Clock: ClockCreated, After: time.Minute},
		{Name: "web", Match: Match{LabelSelector: "app=web"}, Clock: ClockCreated, After: time.Hour},
	}}}
	got, err := e.Decide(newPod(labelled("app", "web")), anyNamespace, now)
	if err != nil {
		t.Fatalf("Decide() error: %v", err)
	}
	if diff := cmp.Diff(ruleDecision("web", ClockCreated, ActionDelete, created.Add(time.Hour)), got); diff != "" {
		t.Errorf("Decide() (-want,+got):\n%s", diff)
	}
}

// TestDecideNeverForces proves that no Decision asks for a grace period below
// one second, even from a Policy built without validation: the pod's own
// grace period applies instead.
func TestDecideNeverForces(t *testing.T) {
	for _, seconds := range []int64{0, -1, -30} {
		e := &Evaluator{Policy: &Policy{Rules: []Rule{
			{Name: "force", Clock: ClockCreated, After: time.Hour, Action: ActionDelete, GracePeriodSeconds: ptr(seconds)},
		}}}
		got, err := e.Decide(newPod(inPhase(corev1.PodRunning)), anyNamespace, now)
		if err != nil {
			t.Fatalf("Decide() error: %v", err)
		}
		if !got.HasDeadline() || got.GracePeriodSeconds != nil {
			t.Errorf("gracePeriodSeconds %d: Decide() = %+v, want a deadline and the pod's own grace period (nil)", seconds, got)
		}
	}
}
