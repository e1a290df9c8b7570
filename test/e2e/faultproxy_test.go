//go:build e2e

package e2e

import (
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// faultProxy is a TLS reverse proxy in front of the API server that breaks
// requests on purpose. podjanitor reaches the API server through it (see
// kubeconfig); the test itself talks to the API server directly, so that what
// it observes is not faulted. The proxy can answer matching requests with an
// error of its choice, hold them before forwarding, and delay, pause or cut
// the event streams of watches. It records every request it answered.
type faultProxy struct {
	srv   *httptest.Server
	proxy *httputil.ReverseProxy

	mu         sync.Mutex
	faults     []*fault
	requests   []proxiedRequest
	watchDelay time.Duration
	paused     bool
	resumed    chan struct{} // closed when the watches are resumed
	streams    map[*watchStream]struct{}
}

// fault breaks the requests it matches. Empty match fields match anything.
type fault struct {
	Method      string // "DELETE", "POST", ...
	Namespace   string
	Pod         string
	Subresource string // "eviction"; "" matches the pod itself only
	Times       int    // how many matching requests it breaks; 0 means all
	// Match, when set, must hold too (requests for other resources than pods).
	Match func(proxiedRequest) bool

	Status     int           // answer with this HTTP status instead of forwarding (0: forward)
	RetryAfter int           // with Status: a Retry-After header of this many seconds
	Delay      time.Duration // hold the request this long before answering or forwarding

	hits int
}

// proxiedRequest is one request the proxy answered.
type proxiedRequest struct {
	At                          time.Time // when the request arrived
	Method, Namespace, Pod, Sub string    // Pod is "" for a list
	Path                        string    // the URL's path
	Query                       url.Values
	Status                      int  // the status sent back (0 if the client went away first)
	Faulted                     bool // a fault matched it
	Injected                    bool // answered by a fault, not by the API server
}

// podPath matches the pods of a namespace, a pod, and a pod's subresource.
var podPath = regexp.MustCompile(`^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(?:/([^/]+))?)?$`)

// newFaultProxy starts a proxy to the API server of the e2e kubeconfig.
func newFaultProxy(t *testing.T) *faultProxy {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(cfg) // the API server's CA and the admin token
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{streams: map[*watchStream]struct{}{}, resumed: make(chan struct{})}
	p.proxy = &httputil.ReverseProxy{
		Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(upstream) },
		Transport:      transport,
		FlushInterval:  -1, // watch events go out as they come
		ModifyResponse: p.modifyResponse,
		ErrorLog:       log.New(io.Discard, "", 0),
	}
	p.srv = httptest.NewUnstartedServer(p)
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	t.Cleanup(func() {
		p.cutWatches()
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

// kubeconfig writes a kubeconfig that reaches the API server through the
// proxy, with the admin kubeconfig's credentials.
func (p *faultProxy) kubeconfig(t *testing.T) string {
	t.Helper()
	admin, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	current, ok := admin.Contexts[admin.CurrentContext]
	if !ok || admin.AuthInfos[current.AuthInfo] == nil {
		t.Fatalf("%s: no current context with credentials", kubeconfig)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["fault-proxy"] = &clientcmdapi.Cluster{
		Server:                   p.srv.URL,
		CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw}),
	}
	cfg.AuthInfos["admin"] = admin.AuthInfos[current.AuthInfo]
	cfg.Contexts["fault-proxy"] = &clientcmdapi.Context{Cluster: "fault-proxy", AuthInfo: "admin"}
	cfg.CurrentContext = "fault-proxy"
	path := filepath.Join(t.TempDir(), "fault-proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// inject adds a fault; the first fault that matches a request applies.
func (p *faultProxy) inject(f *fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, f)
}

// clearFaults removes every fault.
func (p *faultProxy) clearFaults() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = nil
}

// delayWatches holds every chunk of every watch stream for d after it came
// from the API server (0 ends the delay).
func (p *faultProxy) delayWatches(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.watchDelay = d
}

// pauseWatches holds every watch event until resumeWatches or cutWatches.
func (p *faultProxy) pauseWatches() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused, p.resumed = true, make(chan struct{})
	}
}

func (p *faultProxy) resumeWatches() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.resumed)
	}
}

// endWatches ends every open watch stream as the API server does when a
// watch times out, dropping the events it holds; the watcher watches again
// from the last resourceVersion it saw. The watches that follow go through.
func (p *faultProxy) endWatches() { p.stopWatches(io.EOF) }

// cutWatches breaks every open watch stream mid-way, dropping the events it
// holds, as a failing connection does. The watches that follow go through.
func (p *faultProxy) cutWatches() { p.stopWatches(errWatchCut) }

func (p *faultProxy) stopWatches(err error) {
	p.mu.Lock()
	streams := p.streams
	p.streams = map[*watchStream]struct{}{}
	p.mu.Unlock()
	for s := range streams {
		s.stop(err)
	}
	p.resumeWatches()
}

// served returns the requests answered so far for pods of ns, oldest first.
func (p *faultProxy) served(ns string) []proxiedRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []proxiedRequest
	for _, r := range p.requests {
		if r.Namespace == ns {
			out = append(out, r)
		}
	}
	return out
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req := proxiedRequest{At: time.Now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.Query()}
	if m := podPath.FindStringSubmatch(r.URL.Path); m != nil {
		req.Namespace, req.Pod, req.Sub = m[1], m[2], m[3]
	}
	f, ok := p.match(req)
	req.Faulted = ok
	if f.Delay > 0 {
		select {
		case <-time.After(f.Delay):
		case <-r.Context().Done():
			p.record(req) // the client gave up: nothing was forwarded
			return
		}
	}
	if f.Status != 0 {
		req.Status, req.Injected = f.Status, true
		p.record(req)
		writeStatus(w, f, req)
		return
	}
	rec := &statusRecorder{ResponseWriter: w, recorded: func(status int) {
		req.Status = status
		p.record(req) // as soon as the status is known: a watch runs on
	}}
	p.proxy.ServeHTTP(rec, r)
	if rec.status == 0 {
		p.record(req)
	}
}

// isWatch says whether the request is a watch.
func isWatch(q url.Values) bool { return q.Get("watch") == "true" || q.Get("watch") == "1" }

// isList says whether the request lists pods: a LIST, or a watch that
// starts with the current pods (client-go's streaming list).
func (r proxiedRequest) isList() bool {
	return r.Method == http.MethodGet && r.Pod == "" && (!isWatch(r.Query) || r.Query.Get("sendInitialEvents") == "true")
}

// match returns a copy of the first fault that matches and counts the hit.
func (p *faultProxy) match(r proxiedRequest) (fault, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.faults {
		if (f.Method != "" && f.Method != r.Method) || (f.Namespace != "" && f.Namespace != r.Namespace) ||
			(f.Pod != "" && f.Pod != r.Pod) || f.Subresource != r.Sub || (f.Times > 0 && f.hits >= f.Times) ||
			(f.Match != nil && !f.Match(r)) {
			continue
		}
		f.hits++
		return *f, true
	}
	return fault{}, false
}

func (p *faultProxy) record(r proxiedRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, r)
}

// writeStatus answers as the API server would, with a Status object.
func writeStatus(w http.ResponseWriter, f fault, r proxiedRequest) {
	var err *apierrors.StatusError
	const why = "injected by the e2e fault proxy"
	switch f.Status {
	case http.StatusNotFound:
		err = apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, r.Pod)
	case http.StatusTooManyRequests:
		err = apierrors.NewTooManyRequests(why, f.RetryAfter)
	case http.StatusServiceUnavailable:
		err = apierrors.NewServiceUnavailable(why)
	default:
		err = apierrors.NewGenericServerResponse(f.Status, r.Method, schema.GroupResource{Resource: "pods"}, r.Pod, why, 0, true)
	}
	status := err.ErrStatus
	status.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	body, _ := json.Marshal(status)
	w.Header().Set("Content-Type", "application/json")
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	w.WriteHeader(f.Status)
	_, _ = w.Write(body)
}

// statusRecorder calls recorded with the status of the response, once.
type statusRecorder struct {
	http.ResponseWriter
	status   int
	recorded func(int)
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
		s.recorded(code)
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// modifyResponse passes the event stream of a watch through a watchStream.
func (p *faultProxy) modifyResponse(resp *http.Response) error {
	if !isWatch(resp.Request.URL.Query()) || resp.StatusCode != http.StatusOK {
		return nil
	}
	s := &watchStream{p: p, body: resp.Body, chunks: make(chan chunk, 4096), cut: make(chan struct{})}
	p.mu.Lock()
	p.streams[s] = struct{}{}
	p.mu.Unlock()
	go s.pump()
	resp.Body = s
	return nil
}

var errWatchCut = errors.New("watch cut by the e2e fault proxy")

// watchStream is the body of a watch response as the proxy passes it on:
// each chunk read from the API server goes out after the proxy's watch delay,
// and not while the watches are paused.
type watchStream struct {
	p       *faultProxy
	body    io.ReadCloser
	chunks  chan chunk
	pending []byte
	cut     chan struct{} // closed when the stream is stopped
	err     error         // what Read returns once it is
	once    sync.Once
}

type chunk struct {
	data []byte
	at   time.Time
	err  error
}

// pump reads the API server's stream as it comes, stamping each chunk.
func (s *watchStream) pump() {
	for {
		buf := make([]byte, 32<<10)
		n, err := s.body.Read(buf)
		if n > 0 {
			select {
			case s.chunks <- chunk{data: buf[:n], at: time.Now()}:
			case <-s.cut:
				return
			}
		}
		if err != nil {
			select {
			case s.chunks <- chunk{err: err}:
			case <-s.cut:
			}
			return
		}
	}
}

func (s *watchStream) Read(b []byte) (int, error) {
	for len(s.pending) == 0 {
		var c chunk
		select {
		case c = <-s.chunks:
		case <-s.cut:
			return 0, s.err
		}
		if c.err != nil {
			return 0, c.err
		}
		if err := s.hold(c.at); err != nil {
			return 0, err
		}
		s.pending = c.data
	}
	n := copy(b, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// hold waits until a chunk that arrived at arrived may go on.
func (s *watchStream) hold(arrived time.Time) error {
	for {
		s.p.mu.Lock()
		wait, paused, resumed := time.Until(arrived.Add(s.p.watchDelay)), s.p.paused, s.p.resumed
		s.p.mu.Unlock()
		if !paused && wait <= 0 {
			return nil
		}
		var timer <-chan time.Time
		if paused {
			timer = nil // until resumed or cut
		} else {
			resumed, timer = nil, time.After(wait)
		}
		select {
		case <-s.cut:
			return s.err
		case <-resumed:
		case <-timer:
		}
	}
}

func (s *watchStream) stop(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.cut)
		s.body.Close()
	})
}

func (s *watchStream) Close() error {
	s.stop(io.EOF)
	s.p.mu.Lock()
	delete(s.p.streams, s)
	s.p.mu.Unlock()
	return nil
}
