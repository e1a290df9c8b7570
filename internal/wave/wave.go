// Package wave finds the pods that one change of podjanitor's policy makes due
// at once, and says when there are too many of them to remove without a
// person's approval.
//
// A change (the policy file reloaded, say) decides pods again. Its wave is
// the set of pods that are due now, or within a short window, under the new
// decision and were not due by then under the old one: the removals the change
// itself causes. Pods reaching deadlines they already had are never in a wave.
// A wave above the Threshold is held: none of its pods is removed until a
// person approves the change (or reverts it). Compute, Threshold and ChangeID
// are pure; Guard remembers which change is held and which pods it holds now.
package wave

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"iter"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/podjanitor/podjanitor/policy"
)

// Decide decides a pod at a time, as policy.Evaluator.Decide with the pod's
// namespace already found. An error counts as no deadline: a pod whose
// annotations do not parse is never removed.
type Decide func(pod *corev1.Pod, now time.Time) (policy.Decision, error)

// Wave is what a change does: Pods are the keys (namespace/name) of the pods
// it makes due, InScope the number of pods it was computed over. Was has,
// for each of Pods, its deadline before the change (zero: none).
type Wave struct {
	Pods    []string
	Was     []time.Time
	InScope int
}

// Compute returns the wave of a change from old to new over pods at now,
// looking horizon ahead: the pods whose deadline under new is earlier than
// under old (none: never), within now+horizon, and that old did not make
// due by now+window; of those, the ones that come due together, within one
// window-long span (the span where most do; every pod due by now+window
// counts as due now). A horizon no longer than window gives the pods due by
// now+window under new that were not under old. A nil old decides no pod
// (a first install: every due pod is brought forward).
func Compute(pods iter.Seq[*corev1.Pod], old, new Decide, now time.Time, window, horizon time.Duration) Wave {
	var w Wave
	type due struct {
		at  int64 // UnixNano
		was time.Time
		pod *corev1.Pod
	}
	var moved []due
	by, until := now.Add(window), now.Add(max(horizon, window))
	for pod := range pods {
		w.InScope++
		at, ok := deadline(new, pod, now)
		if !ok || at.After(until) {
			continue
		}
		was, ok := deadline(old, pod, now)
		if ok && (!was.After(by) || !at.Before(was)) {
			continue // due by the window under old too, or not brought forward
		}
		if !at.After(by) {
			at = now
		}
		moved = append(moved, due{at.UnixNano(), was, pod})
	}
	slices.SortStableFunc(moved, func(a, b due) int { return cmp.Compare(a.at, b.at) })
	best, start := 0, 0
	for i, j := 0, 0; j < len(moved); j++ {
		for moved[j].at-moved[i].at > int64(window) {
			i++
		}
		if j-i+1 > best {
			best, start = j-i+1, i
		}
	}
	for _, d := range moved[start : start+best] {
		w.Pods = append(w.Pods, d.pod.Namespace+"/"+d.pod.Name)
		w.Was = append(w.Was, d.was)
	}
	return w
}

// deadline is decide's deadline for the pod, if it gives one.
func deadline(decide Decide, pod *corev1.Pod, now time.Time) (time.Time, bool) {
	if decide == nil {
		return time.Time{}, false
	}
	d, err := decide(pod, now)
	if err != nil || !d.HasDeadline() {
		return time.Time{}, false
	}
	return d.Deadline, true
}

// DueBy reports whether decide gives the pod a deadline no later than by.
func DueBy(decide Decide, pod *corev1.Pod, now, by time.Time) bool {
	return dueBy(decide, pod, now, by)
}

func dueBy(decide Decide, pod *corev1.Pod, now, by time.Time) bool {
	if decide == nil {
		return false
	}
	d, err := decide(pod, now)
	return err == nil && d.HasDeadline() && !d.Deadline.After(by)
}

// Threshold is how large a wave may be before it is held, and how far
// ahead it is looked for.
type Threshold struct {
	// Horizon: a change's pods due within it count, the most of them due
	// within one window of each other (Compute); at most the window, the
	// pods due within the window.
	Horizon time.Duration
	// Pods: a wave of more than this many pods is held.
	Pods int
	// Percent: a wave of more than this share of the pods in scope is
	// held; 0 turns the share test off.
	Percent float64
	// MinPods: a wave of at most this many pods is never held by its
	// share (a change in a small cluster or namespace).
	MinPods int
}

// Floor is the largest wave never held, whatever the pods in scope: a
// change that can make no more pods due than this needs no guard.
func (t Threshold) Floor() int {
	if t.Percent > 0 {
		return min(t.Pods, t.MinPods)
	}
	return t.Pods
}

// Exceeded reports whether the wave must be held.
func (t Threshold) Exceeded(w Wave) bool { return t.exceeded(len(w.Pods), w.InScope) }

// exceeded reports whether a wave of n pods out of inScope must be held.
func (t Threshold) exceeded(n, inScope int) bool {
	if n > t.Pods {
		return true
	}
	return t.Percent > 0 && n > t.MinPods && inScope > 0 && float64(n)*100 > t.Percent*float64(inScope)
}

// ChangeID names the change from the policy old to the policy new (their
// bytes; nil old for a first install): the value a person approves. The
// same two policies give the same ID, so an approval covers that change only.
func ChangeID(old, new []byte) string {
	h := sha256.New()
	if old == nil {
		h.Write([]byte("none"))
	} else {
		o := PolicyHash(old)
		h.Write(o[:])
	}
	n := PolicyHash(new)
	h.Write(n[:])
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// PolicyHash is the hash of a policy's bytes, as recorded for the next leader.
func PolicyHash(p []byte) [sha256.Size]byte { return sha256.Sum256(p) }
