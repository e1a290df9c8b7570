//go:build e2e

package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The monitoring kit as shipped: the PodMonitor and PrometheusRule of
// artifacts/monitoring (generated from the chart's monitoring.yaml, equal to
// it by TestChartArtifacts) and the Grafana dashboard.
const (
	podMonitorFile     = "../../artifacts/monitoring/podmonitor.yaml"
	prometheusRuleFile = "../../artifacts/monitoring/prometheusrule.yaml"
	dashboardFile      = "../../artifacts/monitoring/podjanitor-dashboard.json"
)

// Test values: the shipped scrape interval (30s) becomes promScrapeInterval,
// each alert's `for:` is divided by forDivisor (15m becomes 15s), and rules
// are evaluated every promEvalInterval. The expressions are the shipped ones.
const (
	promScrapeInterval = "2s"
	promEvalInterval   = "1s"
	forDivisor         = 60
)

// podMonitor is the part of a monitoring.coreos.com/v1 PodMonitor that the
// scrape configuration is generated from. Decoding is strict: a field the
// generator does not know (and so would not honour) fails the test.
type podMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		PodMetricsEndpoints []podMetricsEndpoint `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type podMetricsEndpoint struct {
	Port              string          `json:"port"`
	Path              string          `json:"path,omitempty"`
	Scheme            string          `json:"scheme,omitempty"`
	Interval          string          `json:"interval,omitempty"`
	ScrapeTimeout     string          `json:"scrapeTimeout,omitempty"`
	HonorLabels       bool            `json:"honorLabels,omitempty"`
	Relabelings       []relabelConfig `json:"relabelings,omitempty"`
	MetricRelabelings []relabelConfig `json:"metricRelabelings,omitempty"`
	Authorization     *struct {
		Type        string                    `json:"type,omitempty"`
		Credentials *corev1.SecretKeySelector `json:"credentials"`
	} `json:"authorization,omitempty"`
	TLSConfig *struct {
		InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
		ServerName         string `json:"serverName,omitempty"`
		CA                 *struct {
			Secret *corev1.SecretKeySelector `json:"secret,omitempty"`
		} `json:"ca,omitempty"`
	} `json:"tlsConfig,omitempty"`
}

// relabelConfig is prometheus-operator's RelabelConfig.
type relabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

func (r relabelConfig) prometheus() map[string]any {
	out := map[string]any{}
	if len(r.SourceLabels) > 0 {
		out["source_labels"] = r.SourceLabels
	}
	if r.Separator != nil {
		out["separator"] = *r.Separator
	}
	if r.TargetLabel != "" {
		out["target_label"] = r.TargetLabel
	}
	if r.Regex != "" {
		out["regex"] = r.Regex
	}
	if r.Modulus != 0 {
		out["modulus"] = r.Modulus
	}
	if r.Replacement != nil {
		out["replacement"] = *r.Replacement
	}
	if r.Action != "" {
		out["action"] = strings.ToLower(r.Action)
	}
	return out
}

func readPodMonitor(t *testing.T) podMonitor {
	t.Helper()
	data, err := os.ReadFile(podMonitorFile)
	if err != nil {
		t.Fatal(err)
	}
	var pm podMonitor
	if err := yaml.UnmarshalStrict(data, &pm); err != nil {
		t.Fatalf("%s: %v (a field the e2e scrape generator does not know: teach podMonitorScrapeConfigs it)", podMonitorFile, err)
	}
	if pm.Kind != "PodMonitor" || len(pm.Spec.PodMetricsEndpoints) == 0 {
		t.Fatalf("%s: kind %q with %d endpoints, want a PodMonitor with endpoints", podMonitorFile, pm.Kind, len(pm.Spec.PodMetricsEndpoints))
	}
	return pm
}

// sanitize is Prometheus's label-name sanitation of Kubernetes label names.
func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, name)
}

// podMonitorScrapeConfigs generates the scrape configurations that
// prometheus-operator generates for pm installed in namespace ns (as by a
// kustomize overlay's namespace:), one per endpoint: Kubernetes service
// discovery of pods in the PodMonitor's namespaces, the pods kept by its
// selector and the container port's name, finished pods dropped, and the
// target labels namespace, container, pod, job (<namespace>/<name>, or the
// jobLabel) and endpoint, followed by the endpoint's own relabelings.
// The endpoint's authorization and tlsConfig become Prometheus's
// authorization and tls_config, with the Secrets they name as files
// (secretFile returns the path of a Secret's key in the PodMonitor's
// namespace; the operator copies the values into the configuration).
// Differences from the operator: there is one shard (no hashmod
// relabelling), and in the test service discovery authenticates with the
// e2e kubeconfig (kubeconfigPath; "" is Prometheus's in-cluster
// ServiceAccount) and the interval is the test's (interval; "" is the
// endpoint's).
func podMonitorScrapeConfigs(t *testing.T, pm podMonitor, ns, kubeconfigPath, interval string, secretFile func(name, key string) string) []map[string]any {
	t.Helper()
	namespaces := []string{ns}
	if s := pm.Spec.NamespaceSelector; s != nil {
		if s.Any {
			t.Fatal("namespaceSelector.any: the e2e generator scrapes the test's namespaces only")
		}
		if len(s.MatchNames) > 0 {
			namespaces = s.MatchNames
		}
	}
	var out []map[string]any
	for i, ep := range pm.Spec.PodMetricsEndpoints {
		if ep.Port == "" {
			t.Fatalf("%s: endpoint %d has no port name", podMonitorFile, i)
		}
		relabel := []map[string]any{
			{"source_labels": []string{"job"}, "target_label": "__tmp_prometheus_job_name"},
			{"action": "drop", "source_labels": []string{"__meta_kubernetes_pod_phase"}, "regex": "(Failed|Succeeded)"},
		}
		keys := make([]string, 0, len(pm.Spec.Selector.MatchLabels))
		for k := range pm.Spec.Selector.MatchLabels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			relabel = append(relabel, map[string]any{"action": "keep",
				"source_labels": []string{"__meta_kubernetes_pod_label_" + sanitize(k), "__meta_kubernetes_pod_labelpresent_" + sanitize(k)},
				"regex":         "(" + pm.Spec.Selector.MatchLabels[k] + ");true"})
		}
		for _, e := range pm.Spec.Selector.MatchExpressions {
			l := sanitize(e.Key)
			switch e.Operator {
			case metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn:
				action := map[metav1.LabelSelectorOperator]string{metav1.LabelSelectorOpIn: "keep", metav1.LabelSelectorOpNotIn: "drop"}[e.Operator]
				relabel = append(relabel, map[string]any{"action": action,
					"source_labels": []string{"__meta_kubernetes_pod_label_" + l, "__meta_kubernetes_pod_labelpresent_" + l},
					"regex":         "(" + strings.Join(e.Values, "|") + ");true"})
			case metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist:
				action := map[metav1.LabelSelectorOperator]string{metav1.LabelSelectorOpExists: "keep", metav1.LabelSelectorOpDoesNotExist: "drop"}[e.Operator]
				relabel = append(relabel, map[string]any{"action": action,
					"source_labels": []string{"__meta_kubernetes_pod_labelpresent_" + l}, "regex": "true"})
			default:
				t.Fatalf("%s: selector operator %q", podMonitorFile, e.Operator)
			}
		}
		relabel = append(relabel,
			map[string]any{"action": "keep", "source_labels": []string{"__meta_kubernetes_pod_container_port_name"}, "regex": ep.Port},
			map[string]any{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
			map[string]any{"target_label": "job", "replacement": ns + "/" + pm.Metadata.Name},
		)
		if pm.Spec.JobLabel != "" {
			relabel = append(relabel, map[string]any{"source_labels": []string{"__meta_kubernetes_pod_label_" + sanitize(pm.Spec.JobLabel)},
				"target_label": "job", "regex": "(.+)", "replacement": "${1}"})
		}
		relabel = append(relabel, map[string]any{"target_label": "endpoint", "replacement": ep.Port})
		for _, r := range ep.Relabelings {
			relabel = append(relabel, r.prometheus())
		}
		var metricRelabel []map[string]any
		for _, r := range ep.MetricRelabelings {
			metricRelabel = append(metricRelabel, r.prometheus())
		}
		if _, err := time.ParseDuration(ep.Interval); ep.Interval != "" && err != nil {
			t.Fatalf("%s: interval %q: %v", podMonitorFile, ep.Interval, err)
		}
		sd := map[string]any{"role": "pod", "namespaces": map[string]any{"names": namespaces}}
		if kubeconfigPath != "" {
			sd["kubeconfig_file"] = kubeconfigPath
		}
		job := map[string]any{
			"job_name":              fmt.Sprintf("podMonitor/%s/%s/%d", ns, pm.Metadata.Name, i),
			"honor_labels":          ep.HonorLabels,
			"metrics_path":          cmp.Or(ep.Path, "/metrics"),
			"scheme":                cmp.Or(ep.Scheme, "http"),
			"kubernetes_sd_configs": []map[string]any{sd},
			"relabel_configs":       relabel,
		}
		if a := ep.Authorization; a != nil {
			if a.Credentials == nil {
				t.Fatalf("%s: endpoint %d: authorization without credentials", podMonitorFile, i)
			}
			job["authorization"] = map[string]any{"type": cmp.Or(a.Type, "Bearer"),
				"credentials_file": secretFile(a.Credentials.Name, a.Credentials.Key)}
		}
		if c := ep.TLSConfig; c != nil {
			tls := map[string]any{}
			if c.InsecureSkipVerify {
				tls["insecure_skip_verify"] = true
			}
			if c.ServerName != "" {
				tls["server_name"] = c.ServerName
			}
			if c.CA != nil && c.CA.Secret != nil {
				tls["ca_file"] = secretFile(c.CA.Secret.Name, c.CA.Secret.Key)
			}
			job["tls_config"] = tls
		}
		if interval != "" {
			job["scrape_interval"], job["scrape_timeout"] = interval, interval
		} else {
			if ep.Interval != "" {
				job["scrape_interval"] = ep.Interval
			}
			if ep.ScrapeTimeout != "" {
				job["scrape_timeout"] = ep.ScrapeTimeout
			}
		}
		if len(metricRelabel) > 0 {
			job["metric_relabel_configs"] = metricRelabel
		}
		out = append(out, job)
	}
	return out
}

// shortenedRuleGroups returns the shipped PrometheusRule's groups as a
// Prometheus rule file, each `for:` divided by forDivisor and every group
// evaluated each promEvalInterval; it returns too each alert's shipped and
// test `for:`.
func shortenedRuleGroups(t *testing.T) (file []byte, shipped, shortened map[string]time.Duration) {
	t.Helper()
	data, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []map[string]any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatalf("%s: %v", prometheusRuleFile, err)
	}
	if rule.Kind != "PrometheusRule" || len(rule.Spec.Groups) == 0 {
		t.Fatalf("%s: kind %q with %d groups", prometheusRuleFile, rule.Kind, len(rule.Spec.Groups))
	}
	shipped, shortened = map[string]time.Duration{}, map[string]time.Duration{}
	for _, g := range rule.Spec.Groups {
		g["interval"] = promEvalInterval
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			r := r.(map[string]any)
			name, _ := r["alert"].(string)
			if name == "" {
				continue // a recording rule
			}
			shipped[name], shortened[name] = 0, 0
			if f, ok := r["for"].(string); ok {
				d, err := time.ParseDuration(f)
				if err != nil {
					t.Fatalf("alert %s: for %q: %v", name, f, err)
				}
				shipped[name], shortened[name] = d, d/forDivisor
				r["for"] = (d / forDivisor).String()
			}
		}
	}
	file, err = yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	return file, shipped, shortened
}

// promServer is a Prometheus process started by the test.
type promServer struct {
	t      *testing.T
	url    string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

// startPrometheus runs Prometheus with the scrape configurations and the
// rule file, and waits until it is ready.
func startPrometheus(t *testing.T, name string, scrape []map[string]any, rules []byte) *promServer {
	t.Helper()
	bin := os.Getenv("PROMETHEUS_BIN")
	if bin == "" {
		t.Fatal("set PROMETHEUS_BIN (hack/e2e.sh builds it with hack/install-prometheus.sh)")
	}
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "podjanitor-rules.yaml")
	if err := os.WriteFile(rulesPath, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval": promScrapeInterval, "scrape_timeout": promScrapeInterval,
			"evaluation_interval": promEvalInterval,
		},
		"rule_files":     []string{rulesPath},
		"scrape_configs": scrape,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("prometheus %s: configuration %s:\n%s", name, cfgPath, cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := &promServer{t: t, url: "http://" + addr, log: filepath.Join(dir, "prometheus.log"), exited: make(chan struct{})}
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=info")
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			lines := strings.Split(string(b), "\n")
			t.Logf("prometheus %s log (last lines):\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-p.exited:
			b, _ := os.ReadFile(p.log)
			t.Fatalf("prometheus exited before it was ready:\n%s", b)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 90s")
		}
	}
	return p
}

// api GETs a Prometheus HTTP API path and decodes its data into out.
func (p *promServer) api(path string, q url.Values, out any) error {
	resp, err := http.Get(p.url + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %v: %s", path, err, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s %s: %s", path, q.Encode(), env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// promAlert is one alert of /api/v1/alerts.
type promAlert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
	Value    string            `json:"value"`
}

func (a promAlert) String() string {
	return fmt.Sprintf("%s{namespace=%q} %s since %s (value %s)", a.Labels["alertname"], a.Labels["namespace"], a.State, a.ActiveAt.Format("15:04:05.000"), a.Value)
}

func (p *promServer) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.api("/api/v1/alerts", nil, &data)
	return data.Alerts, err
}

// waitFiring polls /api/v1/alerts until the alert fires with the labels in
// match, and returns when it was first seen firing; false after timeout.
func (p *promServer) waitFiring(alert string, match map[string]string, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		alerts, err := p.alerts()
		if err == nil {
			for _, a := range alerts {
				if a.State == "firing" && a.Labels["alertname"] == alert && labelsMatch(a.Labels, match) {
					return time.Now(), true
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	return time.Time{}, false
}

func labelsMatch(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// promResult is an instant vector or a range matrix's series.
type promResult struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
	Values [][]any           `json:"values"`
}

func (p *promServer) query(expr string) ([]promResult, error) {
	var data struct {
		Result []promResult `json:"result"`
	}
	err := p.api("/api/v1/query", url.Values{"query": {expr}}, &data)
	return data.Result, err
}

func (p *promServer) queryRange(expr string, start, end time.Time, step time.Duration) ([]promResult, error) {
	var data struct {
		Result []promResult `json:"result"`
	}
	err := p.api("/api/v1/query_range", url.Values{"query": {expr},
		"start": {unixSeconds(start)}, "end": {unixSeconds(end.Add(step))}, "step": {step.String()}}, &data)
	return data.Result, err
}

func unixSeconds(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

// waitQuery polls an instant query until cond holds for its result.
func (p *promServer) waitQuery(t *testing.T, expr string, timeout time.Duration, cond func([]promResult) bool) []promResult {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last []promResult
	var err error
	for time.Now().Before(deadline) {
		if last, err = p.query(expr); err == nil && cond(last) {
			return last
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("prometheus: %s did not return what was awaited within %v: %v (last error %v)", expr, timeout, last, err)
	return nil
}

// promTarget is an active target of /api/v1/targets.
type promTarget struct {
	Labels     map[string]string `json:"labels"`
	ScrapeURL  string            `json:"scrapeUrl"`
	Health     string            `json:"health"`
	LastError  string            `json:"lastError"`
	ScrapePool string            `json:"scrapePool"`
}

func (p *promServer) targets() ([]promTarget, error) {
	var data struct {
		Active []promTarget `json:"activeTargets"`
	}
	err := p.api("/api/v1/targets", url.Values{"state": {"active"}}, &data)
	return data.Active, err
}
