package policy

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

const (
	keyTTL              = "podjanitor.io/ttl"
	keyExpiresAt        = "podjanitor.io/expires-at"
	keyTTLAfterFinished = "podjanitor.io/ttl-after-finished"
	keyKeep             = "podjanitor.io/keep"
)

func TestDecideAnnotations(t *testing.T) {
	finished := created.Add(2 * time.Hour)
	succeeded := []podOption{inPhase(corev1.PodSucceeded),
		withCondition(corev1.PodReady, corev1.ConditionFalse, "PodCompleted", finished)}
	with := func(base []podOption, more ...podOption) []podOption {
		return append(append([]podOption{}, base...), more...)
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want Decision
	}{
		{
			name: "no annotations",
			pod:  newPod(inPhase(corev1.PodRunning)),
			want: Decision{},
		},
		{
			name: "ttl on a running pod evicts",
			pod:  newPod(inPhase(corev1.PodRunning), annotated(keyTTL, "90m")),
			want: Decision{Deadline: created.Add(90 * time.Minute), Action: ActionEvict, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name: "ttl in days and weeks on a pending pod deletes",
			pod:  newPod(annotated(keyTTL, "1w2d12h")),
			want: Decision{Deadline: created.Add((9*24 + 12) * time.Hour), Action: ActionDelete, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name: "expires-at with offset",
			pod:  newPod(inPhase(corev1.PodRunning), annotated(keyExpiresAt, "2026-12-01T10:00:00+01:00")),
			want: Decision{Deadline: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC), Action: ActionEvict, Source: keyExpiresAt, Reason: ReasonExpiresAt},
		},
		{
			name: "expires-at date is midnight UTC",
			pod:  newPod(inPhase(corev1.PodFailed), annotated(keyExpiresAt, "2026-12-01")),
			want: Decision{Deadline: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), Action: ActionDelete, Source: keyExpiresAt, Reason: ReasonExpiresAt},
		},
		{
			name: "expires-at in the past is due",
			pod:  newPod(annotated(keyExpiresAt, "2020-01-01")),
			want: Decision{Deadline: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), Action: ActionDelete, Source: keyExpiresAt, Reason: ReasonExpiresAt},
		},
		{
			name: "ttl-after-finished on a finished pod",
			pod:  newPod(with(succeeded, annotated(keyTTLAfterFinished, "1h"))...),
			want: Decision{Deadline: finished.Add(time.Hour), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name: "ttl-after-finished on an evicted pod without container statuses",
			pod: newPod(inPhase(corev1.PodFailed), withReason("Evicted"), startedAt(created.Add(time.Minute)),
				annotated(keyTTLAfterFinished, "30m")),
			want: Decision{Deadline: created.Add(31 * time.Minute), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name: "ttl-after-finished counts from the last container finish, not an earlier Ready transition",
			pod: newPod(inPhase(corev1.PodSucceeded), annotated(keyTTLAfterFinished, "1h"),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodCompleted", created.Add(10*time.Minute)),
				withContainers(terminatedContainer("Completed", created.Add(5*time.Hour)))),
			want: Decision{Deadline: created.Add(6 * time.Hour), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name: "ttl on a pod without creationTimestamp gives no deadline",
			pod:  newPod(notCreated(), annotated(keyTTL, "1h")),
			want: Decision{},
		},
		{
			name: "expires-at on the Unix epoch is due, with a ttl",
			pod:  newPod(annotated(keyTTL, "1h", keyExpiresAt, "1970-01-01")),
			want: Decision{Deadline: time.Unix(0, 0).UTC(), Action: ActionDelete, Source: keyExpiresAt, Reason: ReasonExpiresAt},
		},
		{
			name: "ttl-after-finished on a running pod gives no deadline yet",
			pod:  newPod(inPhase(corev1.PodRunning), annotated(keyTTLAfterFinished, "1h")),
			want: Decision{},
		},
		{
			name: "ttl-after-finished with a finish time in the future counts from now",
			pod: newPod(inPhase(corev1.PodFailed), annotated(keyTTLAfterFinished, "1h"),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "", now.Add(48*time.Hour))),
			want: Decision{Deadline: now.Add(time.Hour), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished, ClockSkew: true},
		},
		{
			name: "future finish time that does not decide is not reported",
			pod: newPod(inPhase(corev1.PodFailed), annotated(keyTTLAfterFinished, "1h", keyTTL, "1m"),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "", now.Add(48*time.Hour))),
			want: Decision{Deadline: created.Add(time.Minute), Action: ActionDelete, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name: "earliest wins: expires-at before ttl",
			pod:  newPod(annotated(keyTTL, "2d", keyExpiresAt, "2026-11-02")),
			want: Decision{Deadline: time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC), Action: ActionDelete, Source: keyExpiresAt, Reason: ReasonExpiresAt},
		},
		{
			name: "earliest wins: ttl before expires-at",
			pod:  newPod(annotated(keyTTL, "1h", keyExpiresAt, "2026-11-02")),
			want: Decision{Deadline: created.Add(time.Hour), Action: ActionDelete, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name: "earliest wins: ttl-after-finished before ttl",
			pod:  newPod(with(succeeded, annotated(keyTTL, "1d", keyTTLAfterFinished, "10m"))...),
			want: Decision{Deadline: finished.Add(10 * time.Minute), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name: "a tie goes to ttl",
			pod:  newPod(annotated(keyTTL, "12h", keyExpiresAt, "2026-11-02T00:00:00Z")),
			want: Decision{Deadline: created.Add(12 * time.Hour), Action: ActionDelete, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name: "keep vetoes",
			pod:  newPod(annotated(keyKeep, "true", keyTTL, "1h", keyExpiresAt, "2020-01-01")),
			want: Decision{Kept: true},
		},
		{
			name: "keep vetoes even invalid annotations",
			pod:  newPod(annotated(keyKeep, "true", keyTTL, "forever")),
			want: Decision{Kept: true},
		},
		{
			name: "keep false is as if absent",
			pod:  newPod(annotated(keyKeep, "false", keyTTL, "1h")),
			want: Decision{Deadline: created.Add(time.Hour), Action: ActionDelete, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name: "annotations are honoured in kube-system",
			pod:  newPod(inNamespace("kube-system"), annotated(keyTTL, "1h")),
			want: Decision{Deadline: created.Add(time.Hour), Action: ActionDelete, Source: keyTTL, Reason: ReasonTTL},
		},
		{
			name: "mirror pod is skipped",
			pod:  newPod(mirror(), annotated(keyTTL, "1h")),
			want: Decision{Skipped: SkippedMirrorPod},
		},
		{
			name: "mirror pod is skipped before its annotations are read",
			pod:  newPod(mirror(), annotated(keyTTL, "3x")),
			want: Decision{Skipped: SkippedMirrorPod},
		},
		{
			name: "terminating pod is skipped",
			pod:  newPod(terminating(), annotated(keyTTL, "1h")),
			want: Decision{Skipped: SkippedTerminating},
		},
		{
			name: "another prefix's annotations are ignored",
			pod:  newPod(annotated("example.com/ttl", "1h", "podjanitor.io.evil/ttl", "1h")),
			want: Decision{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Evaluator{}
			got, err := e.Decide(tt.pod, anyNamespace, now)
			if err != nil {
				t.Fatalf("Decide() error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide() (-want,+got):\n%s", diff)
			}
			if got.HasDeadline() != !tt.want.Deadline.IsZero() {
				t.Errorf("HasDeadline() = %v", got.HasDeadline())
			}
		})
	}
}

func TestDecideCustomPrefix(t *testing.T) {
	e := &Evaluator{Prefix: "janitor.example.com"}
	pod := newPod(annotated("janitor.example.com/ttl", "1h", keyTTL, "1m", keyKeep, "true"))
	got, err := e.Decide(pod, anyNamespace, now)
	if err != nil {
		t.Fatalf("Decide() error: %v", err)
	}
	want := Decision{Deadline: created.Add(time.Hour), Action: ActionDelete, Source: "janitor.example.com/ttl", Reason: ReasonTTL}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Decide() (-want,+got):\n%s", diff)
	}
}

func TestDecideInvalidAnnotations(t *testing.T) {
	tests := []struct {
		name    string
		pod     *corev1.Pod
		wantErr string
	}{
		{
			name:    "ttl with an unknown unit",
			pod:     newPod(annotated(keyTTL, "3x")),
			wantErr: `annotation podjanitor.io/ttl="3x": unknown unit "x"`,
		},
		{
			name:    "ttl without a unit",
			pod:     newPod(annotated(keyTTL, "3600")),
			wantErr: `annotation podjanitor.io/ttl="3600": missing unit after "3600" (use one of ns, us, ms, s, m, h, d, w)`,
		},
		{
			name:    "ttl empty",
			pod:     newPod(annotated(keyTTL, "")),
			wantErr: `annotation podjanitor.io/ttl="": empty duration`,
		},
		{
			name:    "ttl negative",
			pod:     newPod(annotated(keyTTL, "-1h")),
			wantErr: `annotation podjanitor.io/ttl="-1h": negative duration`,
		},
		{
			name:    "ttl too large",
			pod:     newPod(annotated(keyTTL, "100000w")),
			wantErr: `annotation podjanitor.io/ttl="100000w": too large: the maximum is 15250w1d23h47m16s854ms775us807ns`,
		},
		{
			name:    "expires-at without offset",
			pod:     newPod(annotated(keyExpiresAt, "2026-12-01T10:00:00")),
			wantErr: `annotation podjanitor.io/expires-at="2026-12-01T10:00:00": missing time zone offset (append "Z" for UTC or an offset like "+01:00")`,
		},
		{
			name:    "expires-at not a time",
			pod:     newPod(annotated(keyExpiresAt, "tomorrow")),
			wantErr: `annotation podjanitor.io/expires-at="tomorrow": want RFC 3339 with an offset ("2026-12-01T10:00:00+01:00") or a date ("2026-12-01")`,
		},
		{
			name:    "expires-at in the year 1 does not cancel a ttl",
			pod:     newPod(annotated(keyTTL, "1h", keyExpiresAt, "0001-01-01")),
			wantErr: `annotation podjanitor.io/expires-at="0001-01-01": before 1970-01-01: a date in the past is due at once, but not one before any pod existed`,
		},
		{
			name:    "expires-at as Go's zero time",
			pod:     newPod(annotated(keyExpiresAt, "0001-01-01T00:00:00Z")),
			wantErr: `annotation podjanitor.io/expires-at="0001-01-01T00:00:00Z": before 1970-01-01: a date in the past is due at once, but not one before any pod existed`,
		},
		{
			name:    "ttl-after-finished invalid on a running pod",
			pod:     newPod(inPhase(corev1.PodRunning), annotated(keyTTLAfterFinished, "1hour")),
			wantErr: `annotation podjanitor.io/ttl-after-finished="1hour": unknown unit "hour"`,
		},
		{
			name:    "keep other than true or false",
			pod:     newPod(annotated(keyKeep, "yes", keyTTL, "1h")),
			wantErr: `annotation podjanitor.io/keep="yes": want "true" or "false"`,
		},
		{
			name:    "keep is case-sensitive",
			pod:     newPod(annotated(keyKeep, "True")),
			wantErr: `annotation podjanitor.io/keep="True": want "true" or "false"`,
		},
		{
			name:    "unknown key: keep in another case",
			pod:     newPod(annotated("podjanitor.io/Keep", "true", keyTTL, "1h")),
			wantErr: `annotation podjanitor.io/Keep="true": unknown annotation: did you mean podjanitor.io/keep?`,
		},
		{
			name:    "unknown key: keeps, beside a keep that parses",
			pod:     newPod(annotated("podjanitor.io/keeps", "true", keyKeep, "true")),
			wantErr: `annotation podjanitor.io/keeps="true": unknown annotation: did you mean podjanitor.io/keep?`,
		},
		{
			name:    "unknown key: ttl_after_finished",
			pod:     newPod(inPhase(corev1.PodSucceeded), annotated("podjanitor.io/ttl_after_finished", "1h")),
			wantErr: `annotation podjanitor.io/ttl_after_finished="1h": unknown annotation: did you mean podjanitor.io/ttl-after-finished?`,
		},
		{
			name:    "unknown key: expiresAt",
			pod:     newPod(annotated("podjanitor.io/expiresAt", "2026-12-01")),
			wantErr: `annotation podjanitor.io/expiresAt="2026-12-01": unknown annotation: did you mean podjanitor.io/expires-at?`,
		},
		{
			name:    "unknown key without a near name",
			pod:     newPod(annotated("podjanitor.io/owner", "team-a")),
			wantErr: `annotation podjanitor.io/owner="team-a": unknown annotation: podjanitor reads keep, ttl, expires-at and ttl-after-finished under podjanitor.io/`,
		},
		{
			name:    "several unknown keys: the first in byte order",
			pod:     newPod(annotated("podjanitor.io/zz", "", "podjanitor.io/TTL", "1h", "podjanitor.io/max-age", "1d")),
			wantErr: `annotation podjanitor.io/TTL="1h": unknown annotation: did you mean podjanitor.io/ttl?`,
		},
		{
			name:    "an unknown key before a value that does not parse",
			pod:     newPod(annotated("podjanitor.io/keeps", "true", keyTTL, "3x")),
			wantErr: `annotation podjanitor.io/keeps="true": unknown annotation: did you mean podjanitor.io/keep?`,
		},
		{
			name:    "one invalid annotation among valid ones",
			pod:     newPod(annotated(keyTTL, "1h", keyExpiresAt, "soon")),
			wantErr: `annotation podjanitor.io/expires-at="soon": want RFC 3339 with an offset ("2026-12-01T10:00:00+01:00") or a date ("2026-12-01")`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Evaluator{Policy: mustPolicy(t, Rule{Name: "everything", Clock: ClockCreated})}
			got, err := e.Decide(tt.pod, anyNamespace, now)
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Decide() error = %v, want %s", err, tt.wantErr)
			}
			var annotationErr *AnnotationError
			if !errors.As(err, &annotationErr) || annotationErr.Err == nil || errors.Unwrap(err) != annotationErr.Err {
				t.Errorf("Decide() error %#v is not an *AnnotationError wrapping the cause", err)
			}
			if diff := cmp.Diff(Decision{}, got); diff != "" {
				t.Errorf("Decide() with an error (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestUnknownKeysOfOtherPrefixes: only keys under the prefix are podjanitor's:
// other prefixes that contain it, keys without a prefix, and with another
// --annotation-prefix the default one, are not read.
func TestUnknownKeysOfOtherPrefixes(t *testing.T) {
	for _, tt := range []struct {
		prefix string
		key    string
	}{
		{"", "e2e.podjanitor.io/fate"},
		{"", "podjanitor.io.example.com/keeps"},
		{"", "podjanitor.io"},
		{"", "keeps"},
		{"janitor.example.com", "podjanitor.io/keeps"},
	} {
		e := &Evaluator{Prefix: tt.prefix}
		d, err := e.Decide(newPod(annotated(tt.key, "true"), annotated(e.AnnotationKey(AnnotationTTL), "1h")), anyNamespace, now)
		if err != nil || d.Source != e.AnnotationKey(AnnotationTTL) {
			t.Errorf("prefix %q, key %s: Decide() = %+v, %v; want the ttl's deadline", tt.prefix, tt.key, d, err)
		}
	}
	e := &Evaluator{Prefix: "janitor.example.com"}
	_, err := e.Decide(newPod(annotated("janitor.example.com/keeps", "true")), anyNamespace, now)
	if want := `annotation janitor.example.com/keeps="true": unknown annotation: did you mean janitor.example.com/keep?`; err == nil || err.Error() != want {
		t.Errorf("custom prefix: error %v, want %s", err, want)
	}
}

func mustPolicy(t *testing.T, rules ...Rule) *Policy {
	t.Helper()
	p, err := NewPolicy(rules...)
	if err != nil {
		t.Fatalf("NewPolicy: %v", err)
	}
	return p
}
