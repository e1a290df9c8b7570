// Package promql checks the monitoring kit's queries with Prometheus's own
// PromQL parser: every alert expression of
// charts/podjanitor/files/prometheus-rules.yaml and every query of the
// Grafana dashboard parses, and names only metrics and labels that podjanitor
// exports (artifacts/monitoring/testdata/metrics.txt, which the main module's
// TestMetricNamesFile keeps equal to podjanitor's registry). A module of its
// own, so that Prometheus stays out of the daemon's go.mod.
package promql

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

const (
	rulesFile     = "../../charts/podjanitor/files/prometheus-rules.yaml"
	dashboardFile = "../../charts/podjanitor/files/podjanitor-dashboard.json"
	metricsFile   = "../../artifacts/monitoring/testdata/metrics.txt"
	valuesFile    = "../../artifacts/monitoring/testdata/label-values.txt"
)

// targetLabels are added by the scrape (prometheus-operator's PodMonitor and
// ServiceMonitor), not by podjanitor.
var targetLabels = []string{"namespace", "job", "pod", "instance", "container", "service", "endpoint"}

// exported maps every series name podjanitor exports to its label names;
// values, "metric label" to the values of a label that takes a fixed set.
type exported map[string][]string

func loadExported(t *testing.T) exported {
	t.Helper()
	f, err := os.Open(metricsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := exported{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			t.Fatalf("%s: bad line %q", metricsFile, line)
		}
		name, typ := fields[0], fields[1]
		var names []string
		if len(fields) > 2 {
			names = strings.Split(fields[2], ",")
		}
		switch typ {
		case "histogram":
			out[name+"_bucket"] = append(slices.Clone(names), "le")
			out[name+"_sum"], out[name+"_count"] = names, names
		case "summary":
			out[name] = append(slices.Clone(names), "quantile")
			out[name+"_sum"], out[name+"_count"] = names, names
		default:
			out[name] = names
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) < 20 {
		t.Fatalf("%s lists only %d series", metricsFile, len(out))
	}
	data, err := os.ReadFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 || !slices.Contains(out[fields[0]], fields[1]) {
			t.Fatalf("%s: bad line %q (the metric must have the label)", valuesFile, line)
		}
		out[fields[0]+" "+fields[1]] = strings.Split(fields[2], ",")
	}
	return out
}

// plainAlternatives matches a regular expression that is only alternatives
// of label values, such as "timeout|unavailable".
var plainAlternatives = regexp.MustCompile(`^[a-zA-Z0-9_]+(\|[a-zA-Z0-9_]+)*$`)

// badValues returns the values that m matches and the label never takes.
func (e exported) badValues(metric string, m *labels.Matcher) []string {
	known, ok := e[metric+" "+m.Name]
	if !ok {
		return nil
	}
	var values []string
	switch m.Type {
	case labels.MatchEqual, labels.MatchNotEqual:
		values = []string{m.Value}
	default:
		if !plainAlternatives.MatchString(m.Value) {
			return nil
		}
		values = strings.Split(m.Value, "|")
	}
	var bad []string
	for _, v := range values {
		if !slices.Contains(known, v) {
			bad = append(bad, v)
		}
	}
	return bad
}

// check parses expr and returns what is wrong with it: a syntax error, a
// metric podjanitor does not export, or a label that it does not carry.
func (e exported) check(expr string) []string {
	parsed, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	var labelsIn func(parser.Node) []string
	labelsIn = func(n parser.Node) []string { // labels grouped or matched on, for the metrics below n
		var out []string
		parser.Inspect(n, func(node parser.Node, _ []parser.Node) error {
			switch x := node.(type) {
			case *parser.AggregateExpr:
				out = append(out, x.Grouping...)
			case *parser.BinaryExpr:
				if x.VectorMatching != nil {
					out = append(out, x.VectorMatching.MatchingLabels...)
					out = append(out, x.VectorMatching.Include...)
				}
			}
			return nil
		})
		return out
	}
	var names []string
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				name = m.Value
			}
		}
		labelNames, known := e[name]
		if !known {
			problems = append(problems, fmt.Sprintf("metric %q is not one podjanitor exports", name))
			return nil
		}
		names = append(names, name)
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel && !slices.Contains(labelNames, m.Name) && !slices.Contains(targetLabels, m.Name) {
				problems = append(problems, fmt.Sprintf("metric %s has no label %q (it has %q)", name, m.Name, labelNames))
			}
			if bad := e.badValues(name, m); len(bad) > 0 {
				problems = append(problems, fmt.Sprintf("metric %s: label %s never has the value %q (it has %q)", name, m.Name, bad, e[name+" "+m.Name]))
			}
		}
		return nil
	})
	// A label aggregated on must exist on some metric of the expression.
	for _, l := range labelsIn(parsed) {
		if slices.Contains(targetLabels, l) || l == "le" || l == "quantile" {
			continue
		}
		if !slices.ContainsFunc(names, func(n string) bool { return slices.Contains(e[n], l) }) {
			problems = append(problems, fmt.Sprintf("label %q is on none of %q", l, names))
		}
	}
	return problems
}

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRules: every alert parses, names podjanitor's metrics and labels,
// has a severity, a summary and a description whose template parses.
func TestAlertRules(t *testing.T) {
	e := loadExported(t)
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rg ruleGroups
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rg); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var alerts []string
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			for _, p := range e.check(r.Expr) {
				t.Errorf("alert %s: %s\n  expr: %s", r.Alert, p, r.Expr)
			}
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("alert %s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if s := r.Labels["severity"]; s != "info" && s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want info, warning or critical", r.Alert, s)
			}
			for _, key := range []string{"summary", "description"} {
				text, ok := r.Annotations[key]
				if !ok {
					t.Errorf("alert %s: no %s annotation", r.Alert, key)
					continue
				}
				// Prometheus's alert templates: text/template with these.
				funcs := template.FuncMap{"humanize": fmt.Sprint, "humanizeDuration": fmt.Sprint}
				if _, err := template.New(key).Funcs(funcs).Parse("{{$labels := .Labels}}{{$value := .Value}}" + text); err != nil {
					t.Errorf("alert %s: %s template: %v", r.Alert, key, err)
				}
			}
		}
	}
	want := []string{"PodJanitorAbsent", "PodJanitorNoLeader", "PodJanitorLeaderWithoutWorkers", "PodJanitorPolicyRejected", "PodJanitorRemovalErrors",
		"PodJanitorRemovalsRefused", "PodJanitorEvictionsBlocked", "PodJanitorRemovalsLate", "PodJanitorRemovalBacklog", "PodJanitorNamespaceWatchFailing",
		"PodJanitorPodWatchFailing", "PodJanitorRemovalsHeld"}
	if !slices.Equal(alerts, want) {
		t.Errorf("alerts %q, want %q", alerts, want)
	}
}

// grafanaVariables are replaced by what Grafana would put there.
var grafanaVariables = regexp.MustCompile(`\$(__rate_interval|__interval|__range|namespace)\b`)

func expandGrafana(expr string) string {
	return grafanaVariables.ReplaceAllStringFunc(expr, func(v string) string {
		if v == "$namespace" {
			return ".*"
		}
		return "5m"
	})
}

// TestDashboardQueries: every panel query parses and names podjanitor's
// metrics and labels; the panels the monitoring kit promises are there.
func TestDashboardQueries(t *testing.T) {
	e := loadExported(t)
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dashboard); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var titles []string
	queries := 0
	for _, p := range dashboard.Panels {
		titles = append(titles, p.Title)
		for _, target := range p.Targets {
			queries++
			expr := expandGrafana(target.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q: unknown Grafana variable in %s", p.Title, target.Expr)
				continue
			}
			for _, problem := range e.check(expr) {
				t.Errorf("panel %q: %s\n  expr: %s", p.Title, problem, target.Expr)
			}
		}
	}
	for _, want := range []string{"Removals by reason", "Removal lateness", "Queue depth, scheduled pods and the removal backlog", "Pods scheduled", "API errors"} {
		if !slices.Contains(titles, want) {
			t.Errorf("the dashboard has no panel %q: %q", want, titles)
		}
	}
	if queries < 10 {
		t.Errorf("only %d queries in the dashboard", queries)
	}
}

// TestCheckRejects: the checker itself finds a syntax error, an unknown
// metric and an unknown label.
func TestCheckRejects(t *testing.T) {
	e := loadExported(t)
	for expr, want := range map[string]string{
		`rate(podjanitor_pods_removed_total[5m]`:                   "unclosed",
		`rate(podjanitor_pods_deleted_total[5m])`:                  `metric "podjanitor_pods_deleted_total"`,
		`sum(podjanitor_pods_removed_total{verdict="x"})`:          `no label "verdict"`,
		`sum by (rule) (podjanitor_pods_removed_total)`:            `label "rule"`,
		`histogram_quantile(0.9, podjanitor_removal_lateness_sec)`: `metric "podjanitor_removal_lateness_sec"`,
		`podjanitor_removal_errors_total{error="multiple_budget"}`: `never has the value ["multiple_budget"]`,
		`podjanitor_removal_errors_total{error!~"refused|denied"}`: `never has the value ["denied"]`,
	} {
		problems := e.check(expr)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("check(%s) = %q, want a problem mentioning %s", expr, problems, want)
		}
	}
	for _, valid := range []string{
		`histogram_quantile(0.99, sum by (le, namespace) (rate(podjanitor_removal_lateness_seconds_bucket[5m])))`,
		`podjanitor_removal_errors_total{error=~"multiple_budgets|admission_denied", action="evict"}`,
		`podjanitor_removal_errors_total{error=~"time.*"}`, // not only alternatives: not checked
	} {
		if problems := e.check(valid); len(problems) > 0 {
			t.Errorf("a valid query was refused: %s: %q", valid, problems)
		}
	}
	if problems := e.check(`histogram_quantile(0.99, sum by (le, namespace) (rate(podjanitor_removal_lateness_seconds_bucket[5m])))`); len(problems) > 0 {
		t.Errorf("a valid query was refused: %q", problems)
	}
}
