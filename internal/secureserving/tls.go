package secureserving

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// Cert and key file names in the certificate directory: those of a
// kubernetes.io/tls Secret (cert-manager's among them).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// CertPoll is how often the certificate files are read again.
const CertPoll = 10 * time.Second

// TLSOptions say which certificate is served, and how.
type TLSOptions struct {
	// CertDir holds tls.crt and tls.key; empty: a self-signed certificate
	// for Hosts.
	CertDir string
	Hosts   []string
	// HTTP2 offers HTTP/2 (ALPN h2) as well as HTTP/1.1. Off, as
	// kubebuilder's scaffold has it since the HTTP/2 rapid-reset and
	// stream-cancellation advisories (CVE-2023-44487, CVE-2023-39325).
	HTTP2 bool
	// Served is told when each certificate that starts being served expires.
	Served func(notAfter time.Time)
}

// TLSConfig is the serving configuration. With CertDir, the certificate and
// key are its tls.crt and tls.key, read again every CertPoll (a Secret's
// mount updated by the kubelet, cert-manager renewing it) until ctx is done;
// a pair that does not load (the key not matching the cert while one of them
// is being replaced) leaves the current one served. Without CertDir, a
// self-signed certificate made at start, in memory, for Hosts (and
// localhost), valid for a year.
func TLSConfig(ctx context.Context, opts TLSOptions) (*tls.Config, error) {
	logger := klog.FromContext(ctx)
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if opts.HTTP2 {
		cfg.NextProtos = []string{"h2", "http/1.1"}
	}
	served := opts.Served
	if served == nil {
		served = func(time.Time) {}
	}
	certDir, hosts := opts.CertDir, opts.Hosts
	if certDir == "" {
		pem, key, err := selfSigned(hosts)
		if err != nil {
			return nil, err
		}
		pair, err := tls.X509KeyPair(pem, key)
		if err != nil {
			return nil, fmt.Errorf("self-signed certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		served(pair.Leaf.NotAfter)
		logger.Info("Serving a self-signed certificate made at start", "hosts", hosts)
		return cfg, nil
	}
	files := &certFiles{cert: filepath.Join(certDir, CertFile), key: filepath.Join(certDir, KeyFile), served: served}
	if _, err := files.load(); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	go files.watch(ctx)
	cfg.GetCertificate = files.get
	logger.Info("Serving certificate from files, read again when they change", "dir", certDir, "every", CertPoll)
	return cfg, nil
}

// certFiles serves the last pair of cert and key files that loaded.
type certFiles struct {
	cert, key string
	served    func(notAfter time.Time)

	mu      sync.Mutex
	pair    *tls.Certificate
	certPEM []byte
	keyPEM  []byte
}

func (f *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pair, nil
}

// load reads the files and, when they changed and load as a pair, serves
// them; changed says whether it took a new pair.
func (f *certFiles) load() (changed bool, err error) {
	certPEM, err := os.ReadFile(f.cert)
	if err != nil {
		return false, err
	}
	keyPEM, err := os.ReadFile(f.key)
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pair != nil && string(certPEM) == string(f.certPEM) && string(keyPEM) == string(f.keyPEM) {
		return false, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("%s and %s: %w", f.cert, f.key, err)
	}
	f.pair, f.certPEM, f.keyPEM = &pair, certPEM, keyPEM
	f.served(pair.Leaf.NotAfter)
	return true, nil
}

func (f *certFiles) watch(ctx context.Context) {
	logger := klog.FromContext(ctx)
	lastErr := "" // logged once, not at every poll
	wait.Until(func() {
		changed, err := f.load()
		switch {
		case err != nil && err.Error() != lastErr:
			lastErr = err.Error()
			logger.Error(err, "Not taking the changed serving certificate; serving the previous one")
		case err == nil:
			lastErr = ""
			if changed {
				logger.Info("Serving the changed certificate", "file", f.cert)
			}
		}
	}, CertPoll, ctx.Done())
}

// selfSigned makes a certificate (signed by a CA made for it and discarded)
// for hosts, localhost, 127.0.0.1 and ::1; the first name is the subject.
func selfSigned(hosts []string) (pem, key []byte, err error) {
	var dns []string
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, h := range append(hosts, "localhost") {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, h)
		}
	}
	pem, key, err = cert.GenerateSelfSignedCertKey(dns[0], ips, dns[1:])
	if err != nil {
		return nil, nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	return pem, key, nil
}

// Hosts are the names a self-signed certificate is made for: the host name
// (in a pod, the pod's name).
func Hosts() []string {
	name, err := os.Hostname()
	if err != nil || name == "" {
		return nil
	}
	return []string{name}
}
