package promql

import (
	"cmp"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/promqltest"
	"go.yaml.in/yaml/v3"
)

// alertRule is the expression and the for of rulesFile's alert.
func alertRule(t *testing.T, alert string) (string, time.Duration) {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rg ruleGroups
	if err := yaml.NewDecoder(strings.NewReader(string(data))).Decode(&rg); err != nil {
		t.Fatal(err)
	}
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				hold, err := model.ParseDuration(cmp.Or(r.For, "0s"))
				if err != nil {
					t.Fatal(err)
				}
				return r.Expr, time.Duration(hold)
			}
		}
	}
	t.Fatalf("%s has no alert %s", rulesFile, alert)
	return "", 0
}

// firing evaluates expr every minute from 0 to end over the series of load
// and returns, for each minute, the namespace/job of the alerts firing then
// (as Prometheus's rule evaluation every minute would): those the expression
// has returned at each evaluation for the last hold.
func firing(t *testing.T, expr string, hold time.Duration, load string, end time.Duration) [][]string {
	t.Helper()
	storage := promqltest.LoadedStorage(t, load)
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	pending := map[string]time.Duration{} // since when
	var out [][]string
	for at := time.Duration(0); at <= end; at += time.Minute {
		q, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, time.Unix(0, 0).Add(at))
		if err != nil {
			t.Fatal(err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		vector, err := res.Vector()
		if err != nil {
			t.Fatal(err)
		}
		active := map[string]time.Duration{}
		var now []string
		for _, s := range vector {
			key := s.Metric.Get("namespace") + "/" + s.Metric.Get("job")
			since, ok := pending[key]
			if !ok {
				since = at
			}
			active[key] = since
			if at-since >= hold {
				now = append(now, key)
			}
		}
		q.Close()
		pending = active
		slices.Sort(now)
		out = append(out, now)
	}
	return out
}

// TestPodWatchFailingAlert: PodJanitorPodWatchFailing fires once a
// podjanitor's pod watch has been failing (podjanitor_pod_watch_healthy 0)
// for 5 minutes, for its job, whichever replica's; not for one that
// recovered sooner, nor for a healthy one.
func TestPodWatchFailingAlert(t *testing.T) {
	expr, hold := alertRule(t, "PodJanitorPodWatchFailing")
	got := firing(t, expr, hold, `
load 1m
	podjanitor_pod_watch_healthy{namespace="a",job="podjanitor",pod="a-1"} 1 1 0 0 0 0 0 0 0 1 1
	podjanitor_pod_watch_healthy{namespace="a",job="podjanitor",pod="a-2"} 1 1 1 1 1 1 1 1 1 1 1
	podjanitor_pod_watch_healthy{namespace="b",job="podjanitor",pod="b-1"} 1 0 0 0 0 1 1 1 1 1 1
	podjanitor_pod_watch_healthy{namespace="c",job="podjanitor",pod="c-1"} 1 1 1 1 1 1 1 1 1 1 1
`, 10*time.Minute)
	for minute, alerts := range got {
		want := ""
		if minute >= 7 && minute <= 8 { // failing from minute 2 until minute 9, for 5 minutes from minute 7
			want = "a/podjanitor"
		}
		if strings.Join(alerts, ",") != want {
			t.Errorf("minute %d: firing %q, want %q", minute, alerts, want)
		}
	}
}
