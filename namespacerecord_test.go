package main

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/wave"
)

// recordName is the record ConfigMap of the fixtures' Lease podjanitor/podjanitor.
var recordName = wave.RecordName("podjanitor")

// recordedNamespaces has the leader record what it acted on of each
// namespace (its record loop's first look), and returns the record
// ConfigMap it wrote.
func (f *fixture) recordedNamespaces() *corev1.ConfigMap {
	f.t.Helper()
	cms := f.client.CoreV1().ConfigMaps("podjanitor")
	var before *corev1.ConfigMap
	if cm, err := cms.Get(f.ctx, recordName, metav1.GetOptions{}); err == nil {
		before = cm
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); namespacesOf(f.c).RunRecord(ctx) }()
	defer func() { cancel(); <-done }()
	var cm *corev1.ConfigMap
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		cm, err = cms.Get(ctx, recordName, metav1.GetOptions{})
		return err == nil && (before == nil || !reflect.DeepEqual(cm.BinaryData, before.BinaryData)), nil
	}); err != nil {
		f.t.Fatalf("the namespaces acted on are not recorded in configmap podjanitor/%s", recordName)
	}
	return cm
}

// restore puts the record ConfigMap cm of an earlier podjanitor in place.
func (f *fixture) restore(cm *corev1.ConfigMap) {
	f.t.Helper()
	cm = cm.DeepCopy()
	cm.ResourceVersion = ""
	if _, err := f.client.CoreV1().ConfigMaps("podjanitor").Create(f.ctx, cm, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// TestNamespaceChangedWhileDownIsHeld: podjanitor acts on team-a kept
// (podjanitor.io/keep) and records it; while no podjanitor runs, the keep
// comes off, making its 12 pods due at once. The next start measures the
// namespace against the record, as a change made while it ran: held, none
// of the 12 removed, until approved on the Namespace. Without the record
// the start took the namespace as it found it and removed all 12.
func TestNamespaceChangedWhileDownIsHeld(t *testing.T) {
	first, _, pods := namespaceWaveFixture(t)
	first.start(pods)
	record := first.recordedNamespaces()

	f, ns, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	f.restore(record)
	f.start(pods)
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed at the start after the keep came off while down, want none", n)
	}
	h, _, ok := namespacesOf(f.c).Holds().Held("team-a")
	if !ok || h.Pods != 12 {
		t.Fatalf("held %+v, %v; want the change held with 12 pods", h, ok)
	}
	if !strings.Contains(f.heldNamespacesRecorded(), h.ID) {
		t.Error("the hold is not recorded")
	}
	// Recorded as it was acted on: a second restart still holds it.
	again := f.recordedNamespacesOrSame()
	f2, _, pods2 := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	f2.restore(again)
	f2.start(pods2)
	if n := f2.deletes(); n != 0 {
		t.Fatalf("%d pods removed at a second start, want none", n)
	}

	f.setNamespaceAnnotations(ns, map[string]string{wave.AnnotationApprove: h.ID}, len(pods))
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed after the approval, want 12", n)
	}
}

// recordedNamespacesOrSame is the record ConfigMap as the leader writes it
// now (written at its first look, or the same as before).
func (f *fixture) recordedNamespacesOrSame() *corev1.ConfigMap {
	f.t.Helper()
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); namespacesOf(f.c).RunRecord(ctx) }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	<-done
	cm, err := f.client.CoreV1().ConfigMaps("podjanitor").Get(f.ctx, recordName, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return cm
}

// TestNamespaceUnchangedWhileDownHoldsNothing: a start over a namespace as
// recorded holds nothing: its 12 due pods go.
func TestNamespaceUnchangedWhileDownHoldsNothing(t *testing.T) {
	first, _, pods := namespaceWaveFixtureWith(t, nil, nil)
	first.start(pods)
	record := first.recordedNamespaces()

	f, _, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	f.restore(record)
	f.start(pods)
	if _, _, ok := namespacesOf(f.c).Holds().Held("team-a"); ok {
		t.Error("a namespace as recorded is held")
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

// TestNamespaceMadeAgainWhileDownIsNew: team-a deleted and made again
// (another UID) without the keep while no podjanitor ran is a new
// namespace, not a change: its pods go as they are.
func TestNamespaceMadeAgainWhileDownIsNew(t *testing.T) {
	first, _, pods := namespaceWaveFixture(t)
	first.start(pods)
	record := first.recordedNamespaces()

	f, ns, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	ns = ns.DeepCopy()
	ns.UID = "uid-team-a-again"
	ns.ResourceVersion = ""
	if _, err := f.client.CoreV1().Namespaces().Update(f.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		m, ok := namespaceCached(f, "team-a")
		return ok && m.GetUID() == ns.UID, nil
	}); err != nil {
		t.Fatal("the namespace cache does not have the namespace made again")
	}
	f.restore(record)
	f.start(pods)
	if _, _, ok := namespacesOf(f.c).Holds().Held("team-a"); ok {
		t.Error("a namespace made again is held as a change")
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

func namespaceCached(f *fixture, name string) (metav1.Object, bool) {
	obj, ok, err := f.c.namespaceCache.GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	m, ok := obj.(metav1.Object)
	return m, ok
}

// TestNamespaceRecordThatDoesNotParse: the start is measured as if nothing
// was acted on (a first install): the rules' wave held, none removed.
func TestNamespaceRecordThatDoesNotParse(t *testing.T) {
	f, _, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	f.restore(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: recordName},
		BinaryData: map[string][]byte{"namespaces.json.gz": []byte("not gzip")}})
	f.start(pods)
	if h, held := f.c.waves.Held(); !held || h.Source != wave.SourceStartup || h.Pods != len(pods) {
		t.Fatalf("held %+v, %v; want the start held as a first install over %d pods", h, held, len(pods))
	}
	if n := f.deletes(); n != 0 || len(pods) == 0 {
		t.Errorf("%d pods removed", n)
	}
}

// TestNamespaceRecordForbidden: a record podjanitor may not read (RBAC of
// an older release) measures nothing and starts: the pods go as before.
func TestNamespaceRecordForbidden(t *testing.T) {
	f, _, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	f.client.PrependReactor("get", "configmaps", func(core.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("configmaps"), recordName, nil)
	})
	f.start(pods)
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want 12", n)
	}
}

// TestSpreadChangeMadeBeforeARestartIsHeldAgain: the keep taken off 4
// namespaces of 5 pods each is held as one change across them (the
// Spread); podjanitor restarts. The Spread's hold lived in memory, but the
// record says what was acted on of each namespace (kept, before the
// change): the start measures each again and the Spread holds them again.
// Without the record the restart removed all 20.
func TestSpreadChangeMadeBeforeARestartIsHeldAgain(t *testing.T) {
	first, namespaces := spreadFixture(t, 4)
	first.takeKeepOffAll(namespaces)
	if _, _, ok := first.c.spread.Held(); !ok {
		t.Fatal("the change in 4 namespaces is not held")
	}
	record := first.recordedNamespaces()

	f, _ := spreadFixtureWith(t, 4, nil)
	if _, err := f.client.CoordinationV1().Leases("podjanitor").Create(f.ctx, recordedLease(t, "1m"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.restore(record)
	if err := f.c.startWave(f.ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range f.c.pods.ListKeys() {
		key, err := cache.ParseObjectName(k)
		if err != nil {
			t.Fatal(err)
		}
		f.process(key)
	}
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed after the restart, want none", n)
	}
	if h, _, ok := f.c.spread.Held(); !ok || h.Pods != 20 {
		t.Errorf("spread held %+v, %v after the restart; want 20 pods", h, ok)
	}
}

// TestNamespaceApprovalIsUsedOnce: the keep taken off team-a is held and
// approved on the Namespace; the annotation stays there (podjanitor cannot
// write Namespaces). The keep put back and taken off again is the same
// change made again: held again, under another ID, which the old approval
// does not match, in the same process and across a restart (the record
// keeps the approval taken). Before, its ID was the same and the approval
// left on the Namespace let it through at once.
func TestNamespaceApprovalIsUsedOnce(t *testing.T) {
	f, ns, pods := namespaceWaveFixture(t)
	f.takeKeepOff(ns, pods)
	first, _, ok := namespacesOf(f.c).Holds().Held("team-a")
	if !ok {
		t.Fatal("the keep taken off is not held")
	}
	approved := map[string]string{wave.AnnotationApprove: first.ID}
	f.setNamespaceAnnotations(ns, approved, len(pods))
	if n := f.deletes(); n != 12 {
		t.Fatalf("%d pods removed after the approval, want 12", n)
	}
	f.setNamespaceAnnotations(ns, map[string]string{wave.AnnotationApprove: first.ID, "podjanitor.io/keep": "true"}, len(pods))
	f.setNamespaceAnnotations(ns, approved, len(pods))
	again, _, ok := namespacesOf(f.c).Holds().Held("team-a")
	if !ok || again.ID == first.ID {
		t.Fatalf("the change made again: held %+v, %v; want it held under an ID other than %s", again, ok, first.ID)
	}
	if n := f.deletes(); n != 12 {
		t.Errorf("%d pods removed, want the 12 of the first approval alone", n)
	}

	// Put back, recorded, and taken off again while no podjanitor runs.
	f.setNamespaceAnnotations(ns, map[string]string{wave.AnnotationApprove: first.ID, "podjanitor.io/keep": "true"}, len(pods))
	record := f.recordedNamespaces()
	f2, _, pods2 := namespaceWaveFixtureWith(t, approved, recordedLease(t, "1m"))
	f2.restore(record)
	f2.start(pods2)
	if n := f2.deletes(); n != 0 {
		t.Fatalf("%d pods removed at the start by the approval of an earlier occurrence, want none", n)
	}
	if h, _, ok := namespacesOf(f2.c).Holds().Held("team-a"); !ok || h.ID == first.ID {
		t.Errorf("after the restart: held %+v, %v; want it held under an ID other than %s", h, ok, first.ID)
	}
}

// TestNamespaceRecordWriteFailing: the API server refuses the record's
// writes (500, 503, 429): nothing is recorded meanwhile and nothing is lost,
// the write is made again at each look, and the record is there once the
// API server takes it; a restart then holds the keep taken off while down.
func TestNamespaceRecordWriteFailing(t *testing.T) {
	first, _, pods := namespaceWaveFixture(t)
	first.start(pods)
	faults := []error{
		apierrors.NewInternalError(fmt.Errorf("etcd leader changed")),
		apierrors.NewServiceUnavailable("unavailable"),
		apierrors.NewTooManyRequests("slow down", 1),
	}
	var mu sync.Mutex
	refused := 0
	first.client.PrependReactor("create", "configmaps", func(core.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if refused < len(faults) {
			refused++
			return true, nil, faults[refused-1]
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(first.ctx)
	done := make(chan struct{})
	go func() { defer close(done); namespacesOf(first.c).RunRecord(ctx) }()
	defer func() { cancel(); <-done }()
	cms := first.client.CoreV1().ConfigMaps("podjanitor")
	var record *corev1.ConfigMap
	if err := wait.PollUntilContextTimeout(first.ctx, 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		mu.Lock()
		n := refused
		mu.Unlock()
		cm, err := cms.Get(ctx, recordName, metav1.GetOptions{})
		if err == nil {
			if n < len(faults) {
				return false, fmt.Errorf("recorded after %d of %d refusals", n, len(faults))
			}
			record = cm
			return true, nil
		}
		first.clock.Step(namespacecontroller.RecordInterval) // the next look
		return false, nil
	}); err != nil {
		t.Fatalf("the record once the API server takes it: %v", err)
	}

	f, _, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	f.restore(record)
	f.start(pods)
	if n := f.deletes(); n != 0 {
		t.Errorf("%d pods removed at the start after the keep came off while down, want none", n)
	}
}

// TestNamespaceRecordReadFailing: the record cannot be read at the start
// (500s): a few answers refused, the start reads it again and holds the
// keep taken off while down; refused throughout, the start fails, rather
// than act on changes it cannot measure, and removes nothing.
func TestNamespaceRecordReadFailing(t *testing.T) {
	first, _, pods := namespaceWaveFixture(t)
	first.start(pods)
	record := first.recordedNamespaces()
	for _, c := range []struct {
		name    string
		refuse  int
		started bool
	}{{"two refusals", 2, true}, {"refused throughout", 1000, false}} {
		t.Run(c.name, func(t *testing.T) {
			f, _, pods := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
			f.c.opts.Waves.StartReadFor = time.Second // tried for a second, not the renew deadline
			f.restore(record)
			refused := 0
			f.client.PrependReactor("get", "configmaps", func(core.Action) (bool, runtime.Object, error) {
				if refused < c.refuse {
					refused++
					return true, nil, apierrors.NewInternalError(fmt.Errorf("etcd leader changed"))
				}
				return false, nil, nil
			})
			err := f.c.startWave(f.ctx)
			if (err == nil) != c.started {
				t.Fatalf("start: %v, want started %v", err, c.started)
			}
			if err == nil {
				for _, p := range pods {
					f.process(keyOf(p))
				}
				if _, _, ok := namespacesOf(f.c).Holds().Held("team-a"); !ok {
					t.Error("the keep taken off while down is not held")
				}
			}
			if n := f.deletes(); n != 0 {
				t.Errorf("%d pods removed, want none", n)
			}
		})
	}
}

// TestNamespaceRecordWritesAreBounded: a namespace whose labels flap 50
// times, one flap per look of the record (RecordInterval, 100 s in all),
// costs at most actedBurst (5) writes and then one every 10 s: at most 16,
// not 50; and the last labels are recorded once the flapping stops.
func TestNamespaceRecordWritesAreBounded(t *testing.T) {
	f, ns, pods := namespaceWaveFixtureWith(t, nil, nil)
	f.start(pods)
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); namespacesOf(f.c).RunRecord(ctx) }()
	defer func() { cancel(); <-done }()
	writes := func() int {
		n := 0
		for _, a := range f.client.Actions() {
			if r := a.GetResource().Resource; r == "configmaps" && (a.GetVerb() == "create" || a.GetVerb() == "update") {
				n++
			}
		}
		return n
	}
	ns = ns.DeepCopy()
	for i := range 50 {
		ns.ResourceVersion, ns.Labels = "", map[string]string{"flap": fmt.Sprint(i)}
		if _, err := f.client.CoreV1().Namespaces().Update(f.ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			m, ok := namespaceCached(f, "team-a")
			return ok && m.GetLabels()["flap"] == fmt.Sprint(i), nil
		}); err != nil {
			t.Fatal("the namespace cache does not follow the flaps")
		}
		time.Sleep(5 * time.Millisecond) // the handler took it
		f.clock.Step(namespacecontroller.RecordInterval)
	}
	time.Sleep(50 * time.Millisecond)
	if n := writes(); n > 16 {
		t.Errorf("%d writes of the record for 50 flaps over 100 s, want at most 16", n)
	}
	if err := wait.PollUntilContextTimeout(f.ctx, 5*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		f.clock.Step(namespacecontroller.RecordInterval)
		acted := recordedStates(t, f)
		return strings.Contains(acted["team-a"], `"flap":"49"`), nil
	}); err != nil {
		t.Error("the last labels are not recorded once the flapping stops")
	}
}

// recordedStates is each namespace's state as the record ConfigMap has it.
func recordedStates(t *testing.T, f *fixture) map[string]string {
	t.Helper()
	cm, err := f.client.CoreV1().ConfigMaps("podjanitor").Get(f.ctx, recordName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	acted, err := namespacecontroller.ActedIn(cm)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for name, a := range acted {
		out[name] = string(a.State)
	}
	return out
}
