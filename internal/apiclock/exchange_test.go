package apiclock

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"
)

// dateServer is an HTTP/2 server whose clock is ahead of this machine's by
// ahead, and which answers every request just after a whole second of its
// clock (it waits for one), so that its Date header is its time within a
// millisecond or two: the lower bound a response gives is then ahead less
// the exchange's way back. informational first sends a 103, then waits
// before it answers.
func dateServer(t *testing.T, ahead, informational time.Duration) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if informational > 0 {
			w.WriteHeader(http.StatusEarlyHints)
			time.Sleep(informational)
		}
		server := time.Now().Add(ahead)
		time.Sleep(server.Truncate(time.Second).Add(time.Second + time.Millisecond).Sub(server))
		w.Header().Set("Date", time.Now().Add(ahead).UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusOK)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// slowReturn hands each response back late, as a busy machine's scheduler
// and the client's other wrappers may: after the transport has read it.
type slowReturn struct {
	rt    http.RoundTripper
	delay time.Duration
}

func (s slowReturn) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.rt.RoundTrip(req)
	time.Sleep(s.delay)
	return resp, err
}

func get(ctx context.Context, t *testing.T, client *http.Client, url string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("answered over %s, want HTTP/2 (what client-go speaks to an API server)", resp.Proto)
	}
}

// TestAPIClockTimesTheExchangeNotTheReturn: a response counts as received
// when the transport read it, not when it came back up the wrappers, so a
// slow hand-back does not make every removal that much late. Without the
// trace's times, the lower end would lie the whole 300 ms hand-back below
// the truth.
func TestAPIClockTimesTheExchangeNotTheReturn(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ahead := 42 * time.Second
	srv := dateServer(t, ahead, 0)
	a := New(clock.RealClock{})
	client := &http.Client{Transport: a.Wrap(slowReturn{rt: srv.Client().Transport, delay: 300 * time.Millisecond})}
	get(ctx, t, client, srv.URL)
	got := a.Offset()
	if got > ahead {
		t.Fatalf("Offset() = %v, ahead of the server's %v: removals would be early", got, ahead)
	}
	if got < ahead-150*time.Millisecond {
		t.Errorf("Offset() = %v, %v below the server's %v: the response counted as received when it came back, not when it was read",
			got, ahead-got, ahead)
	}
}

// TestAPIClockDoesNotTimeAnInformationalAnswer: the first byte of a 103 is
// read before the server writes the final answer's Date; counted as the
// answer's, it would put the offset ahead of the server's, and removals
// early.
func TestAPIClockDoesNotTimeAnInformationalAnswer(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ahead := 42 * time.Second
	srv := dateServer(t, ahead, 300*time.Millisecond)
	a := New(clock.RealClock{})
	client := &http.Client{Transport: a.Wrap(srv.Client().Transport)}
	get(ctx, t, client, srv.URL)
	if got := a.Offset(); got > ahead {
		t.Fatalf("Offset() = %v, %v ahead of the server's %v: the 103's first byte counted as the answer's", got, got-ahead, ahead)
	}
}
