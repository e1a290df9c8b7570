package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// ---------------------------------------------------------------- progress

var progressMu sync.Mutex

// progress prints line() on one terminal line every second until stopped.
func progress(line func() string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				progressMu.Lock()
				fmt.Fprintf(os.Stderr, "\r\033[K%s\n", line())
				progressMu.Unlock()
				return
			case <-t.C:
				progressMu.Lock()
				fmt.Fprintf(os.Stderr, "\r\033[K%s", line())
				progressMu.Unlock()
			}
		}
	}()
	return func() { close(done); <-finished }
}

func logf(format string, args ...any) {
	progressMu.Lock()
	defer progressMu.Unlock()
	fmt.Fprintf(os.Stderr, "[bench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// ------------------------------------------------------------- podjanitor

// janitor is a podjanitor process started by the bench.
type janitor struct {
	cmd         *exec.Cmd
	pid         int
	started     time.Time
	metricsURL  string
	readyURL    string
	exited      chan struct{}
	clockTicks  float64
	logFile     *os.File
	baseMetrics metrics
	// With -pod-manifests: the pod that runs this podjanitor (pod.go).
	pod     *corev1.Pod
	pods    *podJanitors
	stopLog func()
}

func startJanitor(cfg *config, name, ns string, workers int) (*janitor, error) {
	return startJanitorBinary(cfg, strings.Fields(cfg.podjanitor), name, ns, workers)
}

// command is the binary and any extra arguments, which follow the driver's.
func startJanitorBinary(cfg *config, command []string, name, ns string, workers int) (*janitor, error) {
	return startJanitorWith(cfg, command, name, []string{
		"--namespace=" + ns,
		fmt.Sprintf("--workers=%d", workers),
		fmt.Sprintf("--kube-api-qps=%g", cfg.qps),
		fmt.Sprintf("--kube-api-burst=%d", cfg.burst),
		fmt.Sprintf("--max-deletions-per-second=%g", cfg.maxDeletions),
	}, ns)
}

// startJanitorWith starts command with the driver's flags (after the
// kubeconfig, before the metrics addresses; as a pod with -pod-manifests);
// tenantNS is the namespace whose tenant policies (-tenant-policies) are
// ensured first, if any.
func startJanitorWith(cfg *config, command []string, name string, flags []string, tenantNS string) (*janitor, error) {
	if podMode != nil && strings.Join(command, " ") == cfg.podjanitor {
		return podMode.start(cfg, append(flags, command[1:]...), name)
	}
	// Another process on the ports would answer for this podjanitor, which
	// fails to bind them (its readiness would be the other one's).
	for _, port := range []int{cfg.metricsPort, cfg.metricsPort + 1} {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return nil, fmt.Errorf("podjanitor's port %d is taken (another bench running? -metrics-port moves it): %w", port, err)
		}
		ln.Close()
	}
	lf, err := os.Create(fmt.Sprintf("%s/podjanitor-%s.log", cfg.outDir, name))
	if err != nil {
		return nil, err
	}
	binary := command[0]
	args := append(append([]string{"--kubeconfig=" + cfg.kubeconfig}, flags...),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", cfg.metricsPort),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", cfg.metricsPort+1),
	)
	if tenants != nil && tenantNS != "" {
		if err := tenants.ensure(tenantNS); err != nil {
			lf.Close()
			return nil, err
		}
		args = append(args, "--tenant-policies")
	}
	cmd := exec.Command(binary, append(args, command[1:]...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// gctrace prints one line per GC to the log (the live heap after marking);
	// it changes nothing else.
	cmd.Env = append(append(os.Environ(), "GODEBUG=gctrace=1"), cfg.podjanitorEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	j := &janitor{
		cmd: cmd, metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", cfg.metricsPort),
		readyURL: fmt.Sprintf("http://127.0.0.1:%d/readyz", cfg.metricsPort+1),
		exited:   make(chan struct{}), clockTicks: 100, logFile: lf,
	}
	j.started = time.Now()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	j.pid = cmd.Process.Pid
	go func() { _ = cmd.Wait(); close(j.exited) }()
	return j, nil
}

// waitReady polls /readyz (the pod cache has synced) and returns the time from start.
func (j *janitor) waitReady(timeout time.Duration) (time.Duration, error) {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-j.exited:
			return 0, fmt.Errorf("podjanitor exited; see %s", j.logFile.Name())
		default:
		}
		resp, err := client.Get(j.readyURL)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return time.Since(j.started), nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, fmt.Errorf("podjanitor not ready after %v", timeout)
}

func (j *janitor) stop() {
	if j.pods != nil {
		j.pods.stop(j)
		return
	}
	_ = j.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-j.exited:
	case <-time.After(40 * time.Second):
		_ = j.cmd.Process.Kill()
		<-j.exited
	}
	j.logFile.Close()
}

// procStats are read from /proc/<pid>.
type procStats struct {
	RSSBytes  int64   `json:"rss_bytes"`
	PeakRSS   int64   `json:"peak_rss_bytes"`
	CPUSecond float64 `json:"cpu_seconds"`
}

func (j *janitor) proc() procStats {
	var s procStats
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", j.pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				switch f[0] {
				case "VmRSS:":
					s.RSSBytes = kb * 1024
				case "VmHWM:":
					s.PeakRSS = kb * 1024
				}
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", j.pid)); err == nil {
		str := string(b)
		if k := strings.LastIndexByte(str, ')'); k > 0 {
			f := strings.Fields(str[k+1:]) // f[0] is field 3 (state)
			if len(f) > 12 {
				ut, _ := strconv.ParseFloat(f[11], 64) // field 14
				st, _ := strconv.ParseFloat(f[12], 64) // field 15
				s.CPUSecond = (ut + st) / j.clockTicks
			}
		}
	}
	return s
}

// ---------------------------------------------------------------- metrics

// metrics is one scrape of the Prometheus text format: series (name plus
// sorted label text, as exposed) to value.
type metrics map[string]float64

func (j *janitor) scrape() (metrics, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(j.metricsURL)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

// apiServerMetrics scrapes the kube-apiserver's own /metrics.
func apiServerMetrics(ctx context.Context, cs kubernetes.Interface) (metrics, error) {
	data, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scraping the API server's metrics: %w", err)
	}
	return parseMetrics(bytes.NewReader(data))
}

func parseMetrics(r io.Reader) (metrics, error) {
	m := metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		k := strings.LastIndexByte(line, ' ')
		if k < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[k+1:], 64)
		if err != nil {
			continue
		}
		m[line[:k]] = v
	}
	return m, sc.Err()
}

// only keeps the series whose labels contain all of the filters.
func (m metrics) only(filters ...string) metrics {
	out := metrics{}
	for k, v := range m {
		ok := true
		for _, f := range filters {
			if !strings.Contains(k, f) {
				ok = false
				break
			}
		}
		if ok {
			out[k] = v
		}
	}
	return out
}

// sum adds every series of name whose labels contain all of the filters (`method="DELETE"`).
func (m metrics) sum(name string, filters ...string) float64 {
	var t float64
	for k, v := range m.only(filters...) {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

func (m metrics) minus(base metrics) metrics {
	out := metrics{}
	for k, v := range m {
		out[k] = v - base[k]
	}
	return out
}

// byLabel groups name's series by the value of label.
func (m metrics) byLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if !strings.HasPrefix(k, name+"{") {
			continue
		}
		i := strings.Index(k, label+`="`)
		if i < 0 {
			continue
		}
		rest := k[i+len(label)+2:]
		out[rest[:strings.IndexByte(rest, '"')]] += v
	}
	return out
}

// histQuantile estimates a quantile from a Prometheus histogram's cumulative
// buckets, interpolating linearly inside a bucket like histogram_quantile().
func (m metrics) histQuantile(name string, q float64) float64 {
	bs := m.buckets(name)
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return math.NaN()
	}
	total := bs[len(bs)-1].count
	rank := q * total
	prevLe, prevCount := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return prevLe
			}
			if b.count == prevCount {
				return b.le
			}
			return prevLe + (b.le-prevLe)*(rank-prevCount)/(b.count-prevCount)
		}
		prevLe, prevCount = b.le, b.count
	}
	return prevLe
}

// fractionOver is the share of a histogram's observations above v,
// interpolated linearly inside the bucket that holds v, as histogram_quantile
// does for quantiles.
func (m metrics) fractionOver(name string, v float64) float64 {
	bs := m.buckets(name)
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return math.NaN()
	}
	total := bs[len(bs)-1].count
	prevLe, prevCount := 0.0, 0.0
	for _, b := range bs {
		if v <= b.le {
			below := prevCount
			if !math.IsInf(b.le, 1) {
				below += (b.count - prevCount) * (v - prevLe) / (b.le - prevLe)
			}
			return 1 - below/total
		}
		prevLe, prevCount = b.le, b.count
	}
	return 0
}

type bucket struct{ le, count float64 }

// buckets returns a histogram's cumulative buckets by bound, the series of
// every label set added together.
func (m metrics) buckets(name string) []bucket {
	byLe := map[float64]float64{}
	for k, v := range m {
		if !strings.HasPrefix(k, name+"_bucket{") {
			continue
		}
		i := strings.Index(k, `le="`)
		rest := k[i+4:]
		le, err := strconv.ParseFloat(rest[:strings.IndexByte(rest, '"')], 64)
		if err != nil {
			continue
		}
		byLe[le] += v
	}
	bs := make([]bucket, 0, len(byLe))
	for le, c := range byLe {
		bs = append(bs, bucket{le, c})
	}
	sort.Slice(bs, func(a, b int) bool { return bs[a].le < bs[b].le })
	return bs
}

// --------------------------------------------------------------- watcher

// tracker watches one namespace and records, per pod name, when its removal
// was first seen: deletionTimestamp set, or the DELETED event.
type tracker struct {
	mu      sync.Mutex
	gone    map[string]time.Time
	changed chan struct{}
}

func watchNamespace(ctx context.Context, cs kubernetes.Interface, ns string) (*tracker, error) {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, err
	}
	return watchFrom(ctx, cs, ns, list.ResourceVersion)
}

// watchFrom is watchNamespace from a resourceVersion.
func watchFrom(ctx context.Context, cs kubernetes.Interface, ns, rv string) (*tracker, error) {
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.AllowWatchBookmarks = true
			return cs.CoreV1().Pods(ns).Watch(ctx, o)
		},
	})
	if err != nil {
		return nil, err
	}
	t := &tracker{gone: map[string]time.Time{}, changed: make(chan struct{}, 1)}
	go func() {
		defer rw.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					return
				}
				now := time.Now()
				pod, isPod := ev.Object.(*corev1.Pod)
				if !isPod {
					continue
				}
				if ev.Type == watch.Deleted || (ev.Type == watch.Modified && pod.DeletionTimestamp != nil) {
					t.mu.Lock()
					if _, seen := t.gone[pod.Name]; !seen {
						t.gone[pod.Name] = now
					}
					t.mu.Unlock()
					select {
					case t.changed <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	return t, nil
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.gone)
}

func (t *tracker) snapshot() map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]time.Time, len(t.gone))
	for k, v := range t.gone {
		out[k] = v
	}
	return out
}

// waitGone waits until n pods are gone or the timeout passes, with a progress line.
func (t *tracker) waitGone(ctx context.Context, n int, timeout time.Duration, label string) bool {
	start := time.Now()
	stop := progress(func() string {
		return fmt.Sprintf("%s: %d/%d pods removed (%.0fs)", label, t.count(), n, time.Since(start).Seconds())
	})
	defer stop()
	deadline := time.After(timeout)
	for t.count() < n {
		select {
		case <-t.changed:
		case <-deadline:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(500 * time.Millisecond):
		}
	}
	return true
}

// loggedAt is the time of the first line of the log that contains text, from
// klog's header ("I1201 10:30:08.657993 ..."), in the year podjanitor started.
func (j *janitor) loggedAt(text string) (time.Time, bool) {
	data, err := os.ReadFile(j.logFile.Name())
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, text) {
			continue
		}
		if at, ok := klogTime(line, j.started.Year()); ok {
			return at, true
		}
	}
	return time.Time{}, false
}

// klogTime reads the time of a klog text line in local time ("I1201 10:30:08.657993").
func klogTime(line string, year int) (time.Time, bool) {
	f := strings.Fields(line)
	if len(f) < 2 || len(f[0]) != 5 {
		return time.Time{}, false
	}
	at, err := time.ParseInLocation("0102 15:04:05.000000", f[0][1:]+" "+f[1], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return at.AddDate(year, 0, 0), true
}

// lastGCLiveHeap returns the live heap (MB) marked by the last GC that
// gctrace logged, and how many GCs were logged.
func (j *janitor) lastGCLiveHeap() (liveMB float64, gcs int) {
	data, err := os.ReadFile(j.logFile.Name())
	if err != nil {
		return math.NaN(), 0
	}
	liveMB = math.NaN()
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "gc ") {
			continue
		}
		// "gc 7 @2.1s 3%: ... ms cpu, 40->41->22 MB, 42 MB goal, ..."
		i := strings.Index(line, " MB, ")
		if i < 0 {
			continue
		}
		f := strings.Fields(line[:i])
		parts := strings.Split(f[len(f)-1], "->")
		if v, err := strconv.ParseFloat(parts[len(parts)-1], 64); err == nil {
			liveMB, gcs = v, gcs+1
		}
	}
	return liveMB, gcs
}

// gcPauses reads gctrace's lines for the GCs that started between from and
// to after the process started: how many, and the longest stop-the-world
// pause (the sweep termination and mark termination phases, in ms).
func (j *janitor) gcPauses(from, to time.Duration) (gcs int, maxPauseMs float64) {
	data, err := os.ReadFile(j.logFile.Name())
	if err != nil {
		return 0, math.NaN()
	}
	for _, line := range strings.Split(string(data), "\n") {
		// "gc 7 @2.104s 3%: 0.021+1.2+0.003 ms clock, ..."
		f := strings.Fields(line)
		if len(f) < 7 || f[0] != "gc" || !strings.HasPrefix(f[2], "@") || f[6] != "clock," {
			continue
		}
		at, err := time.ParseDuration(strings.TrimPrefix(f[2], "@"))
		if err != nil || at < from || at > to {
			continue
		}
		phases := strings.Split(f[4], "+")
		if len(phases) != 3 {
			continue
		}
		sweepTerm, err1 := strconv.ParseFloat(phases[0], 64)
		markTerm, err2 := strconv.ParseFloat(phases[2], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		gcs++
		maxPauseMs = max(maxPauseMs, sweepTerm, markTerm)
	}
	return gcs, maxPauseMs
}
