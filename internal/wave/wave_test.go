package wave

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podjanitor/podjanitor/policy"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// pod is a pod created ago before t0.
func pod(name string, ago time.Duration) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-ago))}}
}

// after decides every pod due after d from its creation, as a rule `after: d`.
func after(d time.Duration) Decide {
	return func(p *corev1.Pod, _ time.Time) (policy.Decision, error) {
		return policy.Decision{Deadline: p.CreationTimestamp.Add(d), Action: policy.ActionDelete}, nil
	}
}

func pods(ps ...*corev1.Pod) func(func(*corev1.Pod) bool) { return slices.Values(ps) }

func TestCompute(t *testing.T) {
	window := time.Minute
	all := []*corev1.Pod{pod("young", 0), pod("hour", time.Hour), pod("week", 8*24*time.Hour)}
	for _, tc := range []struct {
		name     string
		old, new Decide
		want     []string
	}{
		// week was due under the old rule already: its removal is the steady flow.
		{"shorter", after(7 * 24 * time.Hour), after(time.Minute), []string{"ns/young", "ns/hour"}},
		// young is due in 30s: within the window, so in the wave.
		{"due within the window", after(7 * 24 * time.Hour), after(30 * time.Second), []string{"ns/young", "ns/hour"}},
		// young is due in 2m: after the window.
		{"due after the window", after(7 * 24 * time.Hour), after(2 * time.Minute), []string{"ns/hour"}},
		{"deadline got later", after(time.Minute), after(7 * 24 * time.Hour), nil},
		{"no change", after(time.Minute), after(time.Minute), nil},
		// No decision before (a first install): every due pod is in the wave.
		{"first install", nil, after(time.Hour), []string{"ns/hour", "ns/week"}},
		{"no deadline", after(time.Hour), func(*corev1.Pod, time.Time) (policy.Decision, error) { return policy.Decision{}, nil }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Compute(pods(all...), tc.old, tc.new, t0, window, 0)
			if len(w.Was) != len(w.Pods) {
				t.Errorf("%d old deadlines for %d pods", len(w.Was), len(w.Pods))
			}
			w.Was = nil // TestComputeRecordsOldDeadlines
			if diff := cmp.Diff(Wave{Pods: tc.want, InScope: 3}, w); diff != "" {
				t.Errorf("wave (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestComputeDecideErrorIsNotDue(t *testing.T) {
	bad := func(*corev1.Pod, time.Time) (policy.Decision, error) {
		return policy.Decision{Deadline: t0}, &policy.AnnotationError{Key: "podjanitor.io/ttl", Value: "x"}
	}
	if w := Compute(pods(pod("p", time.Hour)), after(7*24*time.Hour), bad, t0, 0, 0); len(w.Pods) != 0 {
		t.Errorf("a pod the new policy cannot decide is in the wave: %v", w.Pods)
	}
	// A pod the old policy could not decide and the new one makes due is in it.
	if w := Compute(pods(pod("p", time.Hour)), bad, after(time.Minute), t0, 0, 0); len(w.Pods) != 1 {
		t.Errorf("wave %v, want the pod", w.Pods)
	}
}

func TestThreshold(t *testing.T) {
	th := Threshold{Pods: 100, Percent: 10, MinPods: 10}
	wave := func(n, inScope int) Wave { return Wave{Pods: make([]string, n), InScope: inScope} }
	for _, tc := range []struct {
		w    Wave
		want bool
	}{
		{wave(100, 100000), false},
		{wave(101, 100000), true},
		{wave(50, 500), false}, // 10% is not more than 10%
		{wave(51, 500), true},
		{wave(10, 10), false}, // at most MinPods: never by its share
		{wave(11, 20), true},
		{wave(0, 0), false},
	} {
		if got := th.Exceeded(tc.w); got != tc.want {
			t.Errorf("%d of %d: exceeded %v, want %v", len(tc.w.Pods), tc.w.InScope, got, tc.want)
		}
	}
	if (Threshold{Pods: 100}).Exceeded(wave(99, 99)) {
		t.Error("Percent 0 must turn the share test off")
	}
	// Floor: no wave of Floor pods is held, in any scope; one more can be.
	for _, th := range []Threshold{th, {Pods: 100}, {Pods: 5, Percent: 10, MinPods: 10}, {Pods: 100, Percent: 50, MinPods: 0}} {
		f := th.Floor()
		for inScope := 0; inScope <= 1000; inScope++ {
			if th.Exceeded(wave(f, inScope)) {
				t.Fatalf("%+v: a wave of its floor %d of %d is held", th, f, inScope)
			}
		}
		if !th.Exceeded(wave(f+1, f+1)) {
			t.Errorf("%+v: a wave of %d, one more than its floor, of %d is not held", th, f+1, f+1)
		}
	}
}

func TestChangeID(t *testing.T) {
	a, b := []byte("rules: a"), []byte("rules: b")
	if ChangeID(a, b) != ChangeID(a, b) {
		t.Error("the same change has two IDs")
	}
	ids := map[string]bool{ChangeID(a, b): true, ChangeID(b, a): true, ChangeID(nil, b): true, ChangeID([]byte{}, b): true}
	if len(ids) != 4 {
		t.Errorf("different changes share an ID: %v", ids)
	}
}

// TestComputeHorizon: with a horizon beyond the window, a change that makes
// pods due together later is a wave as much as one that makes them due
// now; pods it brings forward but spreads out are not, nor pods due past
// the horizon, nor pods whose deadline it does not bring forward.
func TestComputeHorizon(t *testing.T) {
	window, horizon := time.Minute, 24*time.Hour
	var together, spread []*corev1.Pod
	for i := range 10 {
		together = append(together, pod(string(rune('a'+i)), 0))
		spread = append(spread, pod(string(rune('k'+i)), -time.Duration(2*i)*time.Minute)) // created 0, 2, 4 ... 18 min after t0
	}
	for _, tc := range []struct {
		name     string
		pods     []*corev1.Pod
		old, new Decide
		window   time.Duration
		want     int
	}{
		{"together in 3m", together, after(7 * 24 * time.Hour), after(3 * time.Minute), window, 10},
		{"together in 5h", together, after(7 * 24 * time.Hour), after(5 * time.Hour), window, 10},
		{"together past the horizon", together, after(7 * 24 * time.Hour), after(25 * time.Hour), window, 0},
		{"two minutes apart", spread, after(7 * 24 * time.Hour), after(3 * time.Minute), window, 1},
		{"two minutes apart, a 5m window", spread, after(7 * 24 * time.Hour), after(3 * time.Minute), 5 * time.Minute, 3},
		{"later than before", together, after(3 * time.Minute), after(5 * time.Hour), window, 0},
		{"as before", together, after(5 * time.Hour), after(5 * time.Hour), window, 0},
		{"first install, due in an hour", together, nil, after(time.Hour), window, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := Compute(pods(tc.pods...), tc.old, tc.new, t0, tc.window, horizon)
			if len(w.Pods) != tc.want || w.InScope != len(tc.pods) {
				t.Errorf("wave of %d pods (%v) over %d, want %d over %d", len(w.Pods), w.Pods, w.InScope, tc.want, len(tc.pods))
			}
		})
	}
	// A horizon no longer than the window is the window alone.
	if w := Compute(pods(together...), after(7*24*time.Hour), after(3*time.Minute), t0, window, window); len(w.Pods) != 0 {
		t.Errorf("a horizon of the window counts pods due in 3m: %v", w.Pods)
	}
}

// TestComputeRecordsOldDeadlines: each pod of a wave comes with its deadline
// before the change (zero: none), which a Spread lets it go at.
func TestComputeRecordsOldDeadlines(t *testing.T) {
	hour := pod("hour", time.Hour)
	w := Compute(pods(hour), after(7*24*time.Hour), after(time.Minute), t0, time.Minute, 0)
	if len(w.Was) != 1 || !w.Was[0].Equal(hour.CreationTimestamp.Add(7*24*time.Hour)) {
		t.Errorf("old deadlines %v, want the 7-day deadline", w.Was)
	}
	w = Compute(pods(hour), nil, after(time.Minute), t0, time.Minute, 0)
	if len(w.Was) != 1 || !w.Was[0].IsZero() {
		t.Errorf("old deadlines of a first install %v, want none", w.Was)
	}
}
