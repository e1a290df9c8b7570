package apiclock

import (
	"context"
	"fmt"
	"net"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// NewProbe returns RunCalibration's probe for the API server of cfg: a GET
// /version through a client of cfg (its transport wrappers too, Wrap among
// them) on an HTTP/1.1 connection of its own, with no client-side rate limit.
//
// The probes are aimed at a whole second of the API server's clock, and how
// closely their answers bound its offset is their round trip. On the
// connection the other clients share, an answer waits behind a pod watch's
// events, and in their rate limiter behind a backlog's removals; HTTP/2 costs
// each request a hand-over between goroutines at both ends, which HTTP/1.1
// does not (a GET /version on this project's local control plane: 2.5–3.2 ms
// at the median over HTTP/2, 1.6–2.1 ms over HTTP/1.1, on a busy 2-core
// machine). They are a few requests a minute, at most two a second, which
// may be in flight at once (HTTP/1.1 then opens a second connection).
func NewProbe(cfg *rest.Config) (func(context.Context) error, error) {
	c := rest.CopyConfig(cfg)
	c.RateLimiter, c.QPS = nil, -1
	c.NextProtos = []string{"http/1.1"}
	// A dialer of its own: client-go shares one transport, and its
	// connections, among configs that differ in nothing else.
	c.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	d, err := discovery.NewDiscoveryClientForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("creating the clock probe's client: %w", err)
	}
	rc := d.RESTClient()
	return func(ctx context.Context) error { return rc.Get().AbsPath("/version").Do(ctx).Error() }, nil
}
