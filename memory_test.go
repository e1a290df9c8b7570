package main

import (
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

func TestMemoryDefaults(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name        string
		env         map[string]string
		cgroupLimit int64
		want        memorySettings
	}{
		{"nothing set, no cgroup limit", nil, 0, memorySettings{GCPercent: defaultGCPercent, MemoryLimit: -1}},
		{"container limit becomes 90% soft limit", nil, 512 * mib, memorySettings{GCPercent: defaultGCPercent, MemoryLimit: 512 * mib * 9 / 10}},
		{"GOGC from the user is kept", map[string]string{"GOGC": "100"}, 0, memorySettings{GCPercent: -1, MemoryLimit: -1}},
		{"GOGC=off from the user is kept", map[string]string{"GOGC": "off"}, 512 * mib, memorySettings{GCPercent: -1, MemoryLimit: 512 * mib * 9 / 10}},
		{"GOMEMLIMIT from the user is kept", map[string]string{"GOMEMLIMIT": "200MiB"}, 512 * mib, memorySettings{GCPercent: defaultGCPercent, MemoryLimit: -1}},
		{"both from the user", map[string]string{"GOGC": "75", "GOMEMLIMIT": "1GiB"}, 512 * mib, memorySettings{GCPercent: -1, MemoryLimit: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := memoryDefaults(func(k string) string { return tc.env[k] }, tc.cgroupLimit)
			if got != tc.want {
				t.Errorf("memoryDefaults = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestMaxProcsDefault(t *testing.T) {
	for env, want := range map[string]int{"": defaultMaxProcs, "2": -1, "8": -1} {
		got := maxProcsDefault(func(k string) string {
			if k == "GOMAXPROCS" {
				return env
			}
			return ""
		})
		if got != want {
			t.Errorf("GOMAXPROCS=%q: maxProcsDefault = %d, want %d", env, got, want)
		}
	}
}

// TestReleaseSyncMemorySetsMaxProcs: once the first pass is done podjanitor
// runs on defaultMaxProcs, unless GOMAXPROCS is set.
func TestReleaseSyncMemorySetsMaxProcs(t *testing.T) {
	saved := goruntime.GOMAXPROCS(2)
	defer goruntime.GOMAXPROCS(saved)
	synced, idle := func() bool { return true }, func() int { return 0 }
	for env, want := range map[string]int{"": defaultMaxProcs, "2": 2} {
		t.Setenv("GOMAXPROCS", env)
		goruntime.GOMAXPROCS(2)
		var passes firstPasses
		releaseSyncMemory(t.Context(), synced, idle, passes.begin(klog.Background()))
		if got := goruntime.GOMAXPROCS(0); got != want {
			t.Errorf("GOMAXPROCS=%q: %d Ps after the first pass, want %d", env, got, want)
		}
	}
}

// TestTakeoverFirstPassOnAllCores: a standby's first pass (its sync) set
// GOMAXPROCS to 1; its takeover's first pass runs on the container's cores
// again, and its end sets 1 again. A pass that began earlier (the start's,
// of a process that leads at once) ends after the takeover's began: the
// cores stay until the takeover's ends. GOMAXPROCS set in the environment
// is left alone.
func TestTakeoverFirstPassOnAllCores(t *testing.T) {
	saved := goruntime.GOMAXPROCS(0)
	defer goruntime.GOMAXPROCS(saved)
	goruntime.SetDefaultGOMAXPROCS()
	cores := goruntime.GOMAXPROCS(0)
	if cores < 2 {
		t.Skipf("the runtime's GOMAXPROCS is %d: nothing to restore", cores)
	}
	logger := klog.Background()
	t.Setenv("GOMAXPROCS", "")
	check := func(when string, want int) {
		t.Helper()
		if got := goruntime.GOMAXPROCS(0); got != want {
			t.Errorf("%d Ps %s, want %d", got, when, want)
		}
	}
	var passes firstPasses
	passes.begin(logger)()
	check("after the standby's first pass", defaultMaxProcs)
	takeover := passes.begin(logger)
	check("in the takeover's first pass", cores)
	takeover()
	check("after the takeover's first pass", defaultMaxProcs)

	start := passes.begin(logger)
	leading := passes.begin(logger)
	start()
	check("after the start's pass, in the leader's", cores)
	leading()
	check("after the leader's pass", defaultMaxProcs)

	t.Setenv("GOMAXPROCS", "1")
	passes.begin(logger)
	check("in a takeover's first pass with GOMAXPROCS=1 set", 1)
}

func TestCgroupMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"v2 limit", map[string]string{"memory.max": "536870912\n"}, 536870912},
		{"v2 no limit", map[string]string{"memory.max": "max\n"}, 0},
		{"v1 limit", map[string]string{"memory/memory.limit_in_bytes": "268435456\n"}, 268435456},
		{"v1 no limit", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"v2 wins over v1", map[string]string{"memory.max": "1048576", "memory/memory.limit_in_bytes": "268435456"}, 1048576},
		{"garbage", map[string]string{"memory.max": "lots"}, 0},
		{"no cgroup files", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for f, data := range tc.files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := cgroupMemoryLimit(root); got != tc.want {
				t.Errorf("cgroupMemoryLimit = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for live, want := range map[uint64]int{
		0:                          1600, // counted as 1 MiB
		10 * mib:                   160,
		minGCHeadroom * 100 / 50:   defaultGCPercent,
		minGCHeadroom*100/50 - mib: 52,
		200 * mib:                  defaultGCPercent,
		150000 * 700:               defaultGCPercent, // 150,000 idle pods
	} {
		if got := gcPercentFor(live); got != want {
			t.Errorf("gcPercentFor(%d MiB) = %d, want %d", live/mib, got, want)
		}
		if got := gcPercentFor(live); live >= mib && uint64(got)*live/100 < minGCHeadroom {
			t.Errorf("gcPercentFor(%d MiB) = %d leaves %d B of headroom, want at least %d", live/mib, got, uint64(got)*live/100, minGCHeadroom)
		}
	}
}

// tuneGCPercent sets the GC percent after the collections that follow it.
func TestTuneGCPercentFollowsCollections(t *testing.T) {
	saved := debug.SetGCPercent(100)
	defer debug.SetGCPercent(saved)
	var lives []uint64
	var mu sync.Mutex
	stop := tuneGCPercent(func(live uint64) int {
		mu.Lock()
		defer mu.Unlock()
		lives = append(lives, live)
		return 123
	})
	defer stop()
	sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	for range 100 {
		goruntime.GC()
		metrics.Read(sample)
		if sample[0].Value.Uint64() == 123 {
			mu.Lock()
			defer mu.Unlock()
			if len(lives) == 0 || lives[0] == 0 {
				t.Errorf("percent asked for live heaps %v, want a measured one", lives)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("GC percent %d after 100 collections, want 123 from the tuner", sample[0].Value.Uint64())
}
