package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/policy"
)

func TestInvalidAnnotationWarningFitsTheEventsAPI(t *testing.T) {
	for _, size := range []int{5 << 10, 100 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			ttl := apitest.Pod("long-ttl", t0.Add(-time.Hour), corev1.PodSucceeded,
				map[string]string{"podjanitor.io/ttl": "3" + strings.Repeat("h", size)})
			date := apitest.Pod("long-date", t0.Add(-time.Hour), corev1.PodSucceeded,
				map[string]string{"podjanitor.io/expires-at": strings.Repeat("2026-12-01", size/10)})
			f := newFixture(t, Options{}, ttl, date)
			f.process(keyOf(ttl))
			f.process(keyOf(date))

			checkActions(t, nil, f.writes())
			got := f.events()
			if len(got) != 2 {
				t.Fatalf("events = %d, want 2 Warnings", len(got))
			}
			for i, key := range []string{"podjanitor.io/ttl", "podjanitor.io/expires-at"} {
				note, ok := strings.CutPrefix(got[i], "Warning InvalidAnnotation Validate ")
				if !ok {
					t.Fatalf("event %q, want a Warning InvalidAnnotation", got[i][:min(len(got[i]), 80)])
				}
				if len(note) > events.NoteLimit || !utf8.ValidString(note) {
					t.Errorf("note of %d bytes (valid UTF-8: %v); the events API stores at most %d", len(note), utf8.ValidString(note), events.NoteLimit)
				}
				wantSize := fmt.Sprintf("(%d bytes)", len(ttl.Annotations[key])+len(date.Annotations[key]))
				if !strings.Contains(note, "annotation "+key+"=") || !strings.Contains(note, wantSize) {
					t.Errorf("note %q, want it to name the annotation and the value's size %s", note, wantSize)
				}
				t.Logf("note: %s", note)
			}
		})
	}
}

func TestInvalidAnnotationWarnsOncePerPodAndValue(t *testing.T) {
	pod := apitest.Pod("bad", t0.Add(-time.Hour), corev1.PodSucceeded, map[string]string{"podjanitor.io/ttl": "3x"})
	f := newFixture(t, Options{}, pod)
	f.process(keyOf(pod))

	// Updates of the pod that leave the value alone, and a policy reload.
	for rv := 8; rv < 11; rv++ {
		updated := pod.DeepCopy()
		updated.ResourceVersion = strconv.Itoa(rv)
		updated.Labels = map[string]string{"rv": updated.ResourceVersion}
		f.setPod(updated)
		f.process(keyOf(pod))
	}
	if err := f.c.SetEvaluator(&policy.Evaluator{}); err != nil {
		t.Fatal(err)
	}
	f.next()
	if got := f.events(); len(got) != 1 {
		t.Fatalf("events = %q, want one Warning for the pod and its value", got)
	}

	// Another bad value, then the pod replaced under the same name.
	changed := pod.DeepCopy()
	changed.ResourceVersion, changed.Annotations = "11", map[string]string{"podjanitor.io/ttl": "3y"}
	f.setPod(changed)
	f.process(keyOf(pod))
	replaced := changed.DeepCopy()
	replaced.UID, replaced.ResourceVersion = "uid-bad-2", "12"
	f.setPod(replaced)
	f.process(keyOf(pod))
	f.process(keyOf(pod))
	got := f.events()
	if len(got) != 2 || !strings.Contains(got[0], `"3y"`) || !strings.Contains(got[1], `"3y"`) {
		t.Errorf("events = %q, want a Warning for the new value and one for the new pod", got)
	}

	// What was warned is remembered with the pod, and forgotten with it.
	if n := f.c.state.len(); n != 1 {
		t.Errorf("state entries = %d while the pod exists, want 1 (what it was warned about)", n)
	}
	if err := f.c.pods.Delete(replaced); err != nil {
		t.Fatal(err)
	}
	f.process(keyOf(pod))
	if n := f.c.state.len(); n != 0 {
		t.Errorf("state entries = %d once the pod is gone, want 0", n)
	}
}

// setPod stores pod in the informer cache as the informer would.
func (f *fixture) setPod(pod *corev1.Pod) {
	f.t.Helper()
	obj, err := podcache.PodTransform("podjanitor.io")(pod.DeepCopy())
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.c.pods.Update(obj); err != nil {
		f.t.Fatal(err)
	}
}
