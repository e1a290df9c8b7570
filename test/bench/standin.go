package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// standin is a stand-in for the kube-apiserver for the idle-standin
// scenario: it serves podjanitor's pod informer N generated workload pods
// (bound, Running, deadlines a day away) from memory, so podjanitor's memory
// can be measured at pod counts whose real API server does not fit on the
// machine (a local kube-apiserver needs ~20 GB for 150,000 pods).
//
// It answers only what podjanitor asks of an API server while idle: the
// streaming initial list (a watch with sendInitialEvents=true, then the
// "k8s.io/initial-events-end" bookmark), a plain LIST as the fallback, and
// quiet watches that end at their timeoutSeconds as a real server's do.
// It also keeps Leases (the record Lease podjanitor reads at its start and
// writes, and leader election's), as a real server would store them.
// Anything else is answered 404 and logged. Responses are JSON: podjanitor
// asks for protobuf and accepts JSON, so its decode time (and so the sync
// time) is not comparable with a real API server's, but what it keeps in its
// cache is the same.
type standin struct {
	ns, kubeconfig string
	n, nodes       int
	far, created   time.Time
	srv            *http.Server
	mu             sync.Mutex
	unexpected     []string
	leases         map[string][]byte // by path: namespaces/<ns>/leases/<name>
	leaseRV        int
}

// startStandin serves n pods in namespace ns (and none in any other) on a
// loopback port and writes a kubeconfig for it into dir.
func startStandin(dir, ns string, n, nodes int) (*standin, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	now := time.Now()
	s := &standin{ns: ns, n: n, nodes: max(nodes, 1), far: now.Add(24 * time.Hour), created: now.Add(-time.Minute)}
	s.kubeconfig = filepath.Join(dir, "standin.kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: http://%s
contexts:
- name: standin
  context:
    cluster: standin
    user: standin
current-context: standin
users:
- name: standin
  user: {}
`, ln.Addr())
	if err := os.WriteFile(s.kubeconfig, []byte(kc), 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *standin) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	s.mu.Lock() // a watch handler may outlive Shutdown's timeout
	defer s.mu.Unlock()
	if len(s.unexpected) > 0 {
		logf("idle-standin: requests the stand-in did not serve: %s", strings.Join(s.unexpected, "; "))
	}
}

// pod is pod i as the API server would return it (less managedFields and
// the defaults it adds to the spec, none of which podjanitor keeps).
func (s *standin) pod(i int) *corev1.Pod {
	p := workload.Pod(s.ns, fmt.Sprintf("idle-%06d", i), "idle", i,
		s.far.Add(time.Duration(i)*time.Second), fmt.Sprintf("bench-node-%d", i%s.nodes))
	p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	p.UID = types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))
	p.ResourceVersion = strconv.Itoa(i + 1)
	p.CreationTimestamp = metav1.NewTime(s.created)
	p.Status = workload.RunningStatus(p, s.created, i)
	return p
}

// listRV is the resourceVersion of the list: after every pod's.
func (s *standin) listRV() string { return strconv.Itoa(s.n + 1) }

func (s *standin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	podsPath := "/api/v1/namespaces/" + s.ns + "/pods"
	switch {
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/") && strings.HasSuffix(r.URL.Path, "/pods"):
		n := 0
		if r.URL.Path == podsPath {
			n = s.n
		}
		q := r.URL.Query()
		if q.Get("watch") == "true" || q.Get("watch") == "1" {
			bookmark := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}}
			s.watch(w, r, n, func(i int) any { return s.pod(i) }, bookmark, &bookmark.ObjectMeta)
			return
		}
		list := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: s.listRV()}}
		for i := range n {
			list.Items = append(list.Items, *s.pod(i))
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces":
		// The namespace informer reads metadata only: the scenario's
		// namespace, whatever the field selector (--namespace names it).
		ns := func(int) any {
			return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"},
				ObjectMeta: metav1.ObjectMeta{Name: s.ns, UID: "00000000-0000-4000-8000-000000000000", ResourceVersion: "1",
					CreationTimestamp: metav1.NewTime(s.created)}}
		}
		q := r.URL.Query()
		if q.Get("watch") == "true" || q.Get("watch") == "1" {
			bookmark := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"}}
			s.watch(w, r, 1, ns, bookmark, &bookmark.ObjectMeta)
			return
		}
		list := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: s.listRV()}, Items: []metav1.PartialObjectMetadata{*ns(0).(*metav1.PartialObjectMetadata)}}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	case r.Method == http.MethodGet && r.URL.Path == "/version":
		// podjanitor's clock-offset probes read only the Date header.
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2-standin"}`))
	case strings.HasPrefix(r.URL.Path, "/apis/coordination.k8s.io/v1/namespaces/"):
		s.lease(w, r)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events"):
		// Echo the event back, as created.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		body, _ := io.ReadAll(r.Body)
		_, _ = w.Write(body)
	default:
		s.mu.Lock()
		if len(s.unexpected) < 20 {
			s.unexpected = append(s.unexpected, r.Method+" "+r.URL.String())
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound,
			Message: "the stand-in API server does not serve " + r.URL.Path})
	}
}

// lease serves GET, POST (create) and PUT (update) of Leases, keeping each
// as last written with a resourceVersion of its own: enough for podjanitor's
// record Lease and leader election.
func (s *standin) lease(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/apis/coordination.k8s.io/v1/")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases == nil {
		s.leases = map[string][]byte{}
	}
	w.Header().Set("Content-Type", "application/json")
	status := func(code int, reason metav1.StatusReason) {
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Reason: reason, Code: int32(code)})
	}
	switch r.Method {
	case http.MethodGet:
		if body, ok := s.leases[path]; ok {
			_, _ = w.Write(body)
			return
		}
		status(http.StatusNotFound, metav1.StatusReasonNotFound)
	case http.MethodPost, http.MethodPut:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			status(http.StatusBadRequest, metav1.StatusReasonBadRequest)
			return
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil) // JSON or protobuf, as the client sends
		lease, ok := obj.(*coordinationv1.Lease)
		if err != nil || !ok {
			status(http.StatusBadRequest, metav1.StatusReasonBadRequest)
			return
		}
		lease.TypeMeta = metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"}
		meta := &lease.ObjectMeta
		name := meta.Name
		code := http.StatusOK
		if r.Method == http.MethodPost {
			path += "/" + name
			if _, ok := s.leases[path]; ok {
				status(http.StatusConflict, metav1.StatusReasonAlreadyExists)
				return
			}
			code = http.StatusCreated
		} else if _, ok := s.leases[path]; !ok {
			status(http.StatusNotFound, metav1.StatusReasonNotFound)
			return
		}
		s.leaseRV++
		meta.ResourceVersion = strconv.Itoa(s.leaseRV)
		body, _ = json.Marshal(lease)
		s.leases[path] = body
		w.WriteHeader(code)
		_, _ = w.Write(body)
	default:
		status(http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed)
	}
}

// watch streams n objects (item(i)) as ADDED events and then bookmark as the
// end-of-initial-events bookmark when the client asked for initial events,
// then stays quiet until the client goes away or the watch's timeoutSeconds
// pass. bookmarkMeta is the bookmark's metadata, which watch fills in.
func (s *standin) watch(w http.ResponseWriter, r *http.Request, n int, item func(int) any, bookmark any, bookmarkMeta *metav1.ObjectMeta) {
	initial := r.URL.Query().Get("sendInitialEvents") == "true"
	timeout := 10 * time.Minute
	if t, err := strconv.Atoi(r.URL.Query().Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	send := func(typ string, obj any) error {
		raw, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		return enc.Encode(metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}})
	}
	if initial {
		for i := range n {
			if err := send("ADDED", item(i)); err != nil {
				return
			}
			if flusher != nil && i%100 == 99 {
				flusher.Flush()
			}
		}
		bookmarkMeta.ResourceVersion = s.listRV()
		bookmarkMeta.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		if err := send("BOOKMARK", bookmark); err != nil {
			return
		}
	}
	if flusher != nil {
		flusher.Flush()
	}
	select {
	case <-r.Context().Done():
	case <-time.After(timeout):
	}
}
