package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// podjanitor's memory is its pod cache, and RSS follows the Go runtime's heap
// goal: (1 + GOGC/100) times the live heap. With Go's default GOGC=100 RSS is
// about twice the cache. Once the cache has synced podjanitor allocates
// little (a few KB per decision), so collecting more often costs little CPU;
// see BENCHMARKS.md for the measurements behind these defaults.
const (
	// defaultGCPercent applies when GOGC is not set, as long as it leaves
	// the heap minGCHeadroom to grow by (gcPercentFor).
	defaultGCPercent = 50
	// minGCHeadroom is the least the heap may grow by between collections
	// when GOGC is not set. A small cache (a few thousand pods: a live heap
	// of ~10 MiB) left GOGC=50 a few MiB, and podjanitor collected every
	// 2 s while it removed 10 pods a second (145 collections in a 5-minute
	// steady run). With the headroom a small install's RSS is up to
	// ~minGCHeadroom above 1.5 times its live heap; a cache of over 32 MiB
	// (about 40,000 pods) is collected at GOGC=50 as before.
	minGCHeadroom = 16 << 20
	// memoryLimitRatio of the container's memory limit becomes the runtime's
	// soft memory limit when GOMEMLIMIT is not set, so that the heap is
	// collected harder before the kernel would OOM-kill the container. The
	// rest is left for memory that the soft limit does not bound (stacks
	// growing under load, the kernel's view of freed pages not yet returned).
	memoryLimitRatio = 0.9
	// cgroupRoot is where a container sees its own cgroup.
	cgroupRoot = "/sys/fs/cgroup"
)

// defaultMaxProcs is the GOMAXPROCS podjanitor runs with once its first
// pass is done (firstPasses), when GOMAXPROCS is not set. From then on
// its work is a watch stream and requests to the API server, each a few
// microseconds of CPU between waits: with a second P, nearly every goroutine
// woken (a timer, a response, a watch event) also woke another thread to look
// for work that was not there. That was a fifth of podjanitor's CPU while it
// removed 2,000 pods over 5 minutes; on one P the same removals took 22 %
// less CPU, as late (BENCHMARKS.md, "One P"). The start itself (decoding the
// initial list, the first pass over every pod) keeps the runtime's GOMAXPROCS,
// for a machine with cores to spare: that work is CPU-bound, and can overlap.
const defaultMaxProcs = 1

// maxProcsDefault is defaultMaxProcs unless GOMAXPROCS is set (-1: leave the
// runtime's, which is GOMAXPROCS or the CPUs the process may use).
func maxProcsDefault(getenv func(string) string) int {
	if getenv("GOMAXPROCS") != "" {
		return -1
	}
	return defaultMaxProcs
}

// memorySettings are the runtime settings podjanitor applies at start; -1
// leaves a setting as the runtime has it (from GOGC / GOMEMLIMIT, or Go's default).
type memorySettings struct {
	GCPercent   int
	MemoryLimit int64
}

// memoryDefaults decides the settings: defaultGCPercent unless GOGC is set,
// and memoryLimitRatio of the cgroup's memory limit (0: none) unless
// GOMEMLIMIT is set.
func memoryDefaults(getenv func(string) string, cgroupLimit int64) memorySettings {
	s := memorySettings{GCPercent: -1, MemoryLimit: -1}
	if getenv("GOGC") == "" {
		s.GCPercent = defaultGCPercent
	}
	if getenv("GOMEMLIMIT") == "" && cgroupLimit > 0 {
		s.MemoryLimit = int64(float64(cgroupLimit) * memoryLimitRatio)
	}
	return s
}

// cgroupMemoryLimit returns the memory limit of the cgroup the process runs
// in, under root: cgroup v2's memory.max, or cgroup v1's
// memory/memory.limit_in_bytes. 0 means no limit (or none found).
func cgroupMemoryLimit(root string) int64 {
	for _, f := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(data))
		if v == "max" {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 64)
		// cgroup v1 reports "no limit" as a huge page-rounded number.
		if err != nil || n <= 0 || n >= math.MaxInt64/2 {
			return 0
		}
		return n
	}
	return 0
}

// applyRuntimeDefaults sets the runtime's GC percent and soft memory limit
// as memoryDefaults decides, and logs the settings in effect, GOMAXPROCS's
// included (set by firstPasses).
func applyRuntimeDefaults(logger klog.Logger) {
	procs := "GOMAXPROCS=" + os.Getenv("GOMAXPROCS")
	if n := maxProcsDefault(os.Getenv); n > 0 {
		procs = fmt.Sprintf("%d, %d from the end of the first pass (default)", goruntime.GOMAXPROCS(0), n)
	}
	s := memoryDefaults(os.Getenv, cgroupMemoryLimit(cgroupRoot))
	gogc := "GOGC=" + os.Getenv("GOGC")
	if s.GCPercent >= 0 {
		debug.SetGCPercent(s.GCPercent)
		tuneGCPercent(gcPercentFor)
		gogc = fmt.Sprintf("%d, or more for a live heap under %d MiB (default)", s.GCPercent, minGCHeadroom*100/s.GCPercent>>20)
	}
	limit := "GOMEMLIMIT=" + os.Getenv("GOMEMLIMIT")
	switch {
	case s.MemoryLimit > 0:
		debug.SetMemoryLimit(s.MemoryLimit)
		limit = fmt.Sprintf("%d bytes (%.0f%% of the cgroup's memory limit)", s.MemoryLimit, 100*memoryLimitRatio)
	case os.Getenv("GOMEMLIMIT") == "":
		limit = "none"
	}
	logger.Info("Go runtime settings", "maxProcs", procs, "gcPercent", gogc, "softMemoryLimit", limit)
}

// releaseWait bounds how long releaseSyncMemory waits for the first pass.
const releaseWait = 2 * time.Minute

// releaseSyncMemory returns the heap that the initial sync left behind to the
// operating system: decoding the initial pod list, and the workers' first
// pass over its keys (each decision unpacks a pod). It waits until the cache
// has synced and the queue holds no ready key (every pod removed or parked),
// or at most releaseWait after the sync (a follower's workers wait for the
// lease). Without it the process keeps the heap that the sync grew to (up to
// 1.5 times the live heap with GOGC=50) long after, although an idle
// controller allocates almost nothing. Then it calls passDone (firstPasses.begin).
func releaseSyncMemory(ctx context.Context, synced cache.InformerSynced, pending func() int, passDone func()) {
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return
	}
	deadline := time.Now().Add(releaseWait)
	for pending() > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
	debug.FreeOSMemory()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	klog.FromContext(ctx).V(2).Info("Returned the initial sync's memory to the OS", "heapInUse", m.HeapInuse, "heapReleased", m.HeapReleased)
	passDone()
}

// firstPasses sets GOMAXPROCS as maxProcsDefault decides once a first pass
// is done, and gives the process the container's cores again when another
// begins: a takeover's first pass decides every cached pod, CPU-bound work
// like a start's, which a standby's GOMAXPROCS of 1 would slow down.
type firstPasses struct {
	mu    sync.Mutex
	begun int // passes begun: only the last one's end sets GOMAXPROCS
}

// begin starts a first pass on the runtime's GOMAXPROCS (the cores the
// container may use), unless GOMAXPROCS is set, and returns what its end
// calls.
func (p *firstPasses) begin(logger klog.Logger) (done func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.begun++
	pass := p.begun
	if maxProcsDefault(os.Getenv) > 0 && pass > 1 {
		was := goruntime.GOMAXPROCS(0)
		goruntime.SetDefaultGOMAXPROCS()
		if n := goruntime.GOMAXPROCS(0); n != was {
			logger.Info("First pass begins; GOMAXPROCS set to the container's cores", "gomaxprocs", n, "was", was)
		}
	}
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if pass != p.begun {
			return
		}
		if n := maxProcsDefault(os.Getenv); n > 0 {
			if was := goruntime.GOMAXPROCS(n); was != n {
				logger.Info("First pass done; GOMAXPROCS set for the steady state", "gomaxprocs", n, "was", was)
			}
		}
	}
}

// gcPercentFor is the GC percent for a live heap of live bytes when GOGC is
// not set: defaultGCPercent, or more where that would leave the heap less
// than minGCHeadroom to grow by before the next collection.
func gcPercentFor(live uint64) int {
	live = max(live, 1<<20)
	return max(defaultGCPercent, int((minGCHeadroom*100+live-1)/live))
}

// tuneGCPercent sets the GC percent to percentFor(the live heap) after every
// collection until stop is called: a finalizer on an object that nothing
// keeps runs once the collection that found it unreachable is done, and arms
// the next.
func tuneGCPercent(percentFor func(live uint64) int) (stop func()) {
	var stopped atomic.Bool
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	current := -1
	var arm func()
	arm = func() {
		goruntime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) {
			if stopped.Load() {
				return
			}
			metrics.Read(samples)
			if samples[0].Value.Kind() == metrics.KindUint64 {
				if p := percentFor(samples[0].Value.Uint64()); p != current {
					debug.SetGCPercent(p)
					current = p
				}
			}
			arm()
		})
	}
	arm()
	return func() { stopped.Store(true) }
}

// gcSentinel is the object whose finalizer follows the collections; not a
// tiny allocation, which may share a block whose finalizer never runs.
type gcSentinel struct{ _ [32]byte }
