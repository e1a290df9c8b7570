package main

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestCDFPoints(t *testing.T) {
	got := cdfPoints([]time.Duration{3 * time.Millisecond, -time.Millisecond, 1500 * time.Microsecond, 10 * time.Millisecond})
	want := [][2]float64{{-1, 0.25}, {1.5, 0.5}, {3, 0.75}, {10, 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("cdfPoints = %v, want %v", got, want)
	}
}

func TestLogTicks125(t *testing.T) {
	var labels []string
	for _, tk := range (logTicks125{}).Ticks(0.1, 100) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	want := []string{"0.1", "0.2", "0.5", "1", "2", "5", "10", "20", "50", "100"}
	if !slices.Equal(labels, want) {
		t.Fatalf("labels %v, want %v", labels, want)
	}
}

func testBench(t *testing.T) *bench {
	cfg := &config{outDir: t.TempDir(), command: "make bench BENCH_PODS=3", commit: "abc1234"}
	return &bench{cfg: cfg, res: &results{Started: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}}
}

// readChart checks that the PNG decodes and returns the chart's data.
func readChart(t *testing.T, b *bench, base string, files []string) chartData {
	t.Helper()
	pngPath, jsonPath := filepath.Join(b.cfg.outDir, base+".png"), filepath.Join(b.cfg.outDir, base+".json")
	if !slices.Contains(files, pngPath) || !slices.Contains(files, jsonPath) {
		t.Fatalf("files %v, want %s and %s", files, pngPath, jsonPath)
	}
	f, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if cfg, err := png.DecodeConfig(f); err != nil || cfg.Width < 400 || cfg.Height < 200 {
		t.Fatalf("%s: %v, %dx%d", pngPath, err, cfg.Width, cfg.Height)
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var d chartData
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if d.Command != "make bench BENCH_PODS=3" || d.Commit != "abc1234" || d.Chart != base+".png" || !d.Started.Equal(b.res.Started) {
		t.Fatalf("chart data without the bench's command, commit or start: %+v", d)
	}
	return d
}

func TestWriteLatenessCDF(t *testing.T) {
	b := testBench(t)
	files, err := b.writeLatenessCDF("steady-5m-lateness", "steady 5m", []remover{
		{"podjanitor", []time.Duration{9 * time.Millisecond, 12 * time.Millisecond, -time.Millisecond, 30 * time.Millisecond}},
		{"ideal remover", []time.Duration{4 * time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}},
		{"nobody", nil}, // no removals: no line
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 {
		t.Fatalf("files %v, want the CDF, its tail and their data", files)
	}
	tail := readChart(t, b, "steady-5m-lateness-tail", files)
	d := readChart(t, b, "steady-5m-lateness", files)
	if !slices.EqualFunc(d.Series, tail.Series, func(a, b chartSeries) bool { return slices.Equal(a.Points, b.Points) }) {
		t.Fatal("the tail chart's data differs from the CDF's")
	}
	if len(d.Series) != 2 || len(d.Series[0].Points) != 4 || len(d.Series[1].Points) != 3 {
		t.Fatalf("series %+v, want podjanitor's 4 and the ideal's 3 removals", d.Series)
	}
	if p := d.Series[0].Points; p[0] != [2]float64{-1, 0.25} || p[3] != [2]float64{30, 1} {
		t.Fatalf("podjanitor's points %v: want the sorted lateness in ms, the early one as it was", p)
	}
}

func TestWriteRSSChart(t *testing.T) {
	b := testBench(t)
	series := []chartSeries{{Name: "podjanitor", Points: [][2]float64{{0, 20}, {1, 30.5}, {2, 31}}}}
	files, err := b.writeRSSChart("steady-5m-rss", "RSS", series, []chartMark{{"first deadline", 1.5}})
	if err != nil {
		t.Fatal(err)
	}
	d := readChart(t, b, "steady-5m-rss", files)
	if len(d.Series) != 1 || len(d.Series[0].Points) != 3 || len(d.Marks) != 1 || d.Marks[0].X != 1.5 {
		t.Fatalf("data %+v", d)
	}
}

func TestRSSSamplerSkipsAbsentProcesses(t *testing.T) {
	n := int64(0)
	s := sampleRSS(time.Now(), time.Hour, []string{"up", "gone"},
		func() procStats { n++; return procStats{RSSBytes: 1 << 20} },
		func() procStats { return procStats{} })
	got := s.stop()
	if len(got) != 2 || len(got[0].Points) < 2 || got[0].Points[0][1] != 1 || len(got[1].Points) != 0 {
		t.Fatalf("%+v: want samples (MiB) at the start and at stop for the live process, none for the gone one", got)
	}
}

func TestCommitOfAndShellJoin(t *testing.T) {
	if c := commitOf("podjanitor v0.9.0-3-gabc1234 (commit abc1234)\n"); c != "abc1234" {
		t.Errorf("commitOf = %q", c)
	}
	if c := commitOf("podjanitor dev"); c != "" {
		t.Errorf("commitOf without a commit = %q", c)
	}
	if s := shellJoin([]string{"bench", "-pods", "3", "-podjanitor", "bin/pj --x", "it's"}); s != `bench -pods 3 -podjanitor 'bin/pj --x' 'it'\''s'` {
		t.Errorf("shellJoin = %s", s)
	}
}
