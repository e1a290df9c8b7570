package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/transport"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/apiclock"
	"github.com/podjanitor/podjanitor/internal/clientfeatures"
	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
	podjanitorinformers "github.com/podjanitor/podjanitor/pkg/generated/informers/externalversions"
	"github.com/podjanitor/podjanitor/policy"
)

// The setup that the daemon and `podjanitor plan` share: what they read the
// cluster with (clients, informers, the namespaces they see) and what they
// decide with (the evaluator), from the same flags.

// clients are the API server clients made from one configuration, and the
// clocks their responses are read with.
type clients struct {
	config *rest.Config
	kube   kubernetes.Interface
	// informerKube is kube with the pods of CoreV1 decoded lean
	// (podcache.LeanDecoding), for the pod informer alone.
	informerKube kubernetes.Interface
	metadata     metadata.Interface
	// podjanitor is the client of podjanitor's own resources (tenant policies).
	podjanitor versioned.Interface
	// clock is the process's steady clock (apiclock.ProcessClock); apiClock
	// reads the API server's offset from it in every response.
	clock    clock.WithTicker
	apiClock *apiclock.Clock
	// probeClock is the API-server clock's probe (apiclock.NewProbe).
	probeClock func(context.Context) error
}

// connect is the preamble the daemon and plan share: the clients of the
// flags, with the API server's clock read from every response and wrappers
// around the transport after it.
func connect(logger klog.Logger, flags clusterFlags, wrappers ...transport.WrapperFunc) (*clients, error) {
	// client-go's feature gates as podjanitor's own, before any client reads them.
	if err := clientfeatures.Install(logger); err != nil {
		return nil, err
	}
	cfg, err := restConfig(flags)
	if err != nil {
		return nil, err
	}
	clk, err := apiclock.ProcessClock(logger)
	if err != nil {
		return nil, err
	}
	apiClk := apiclock.New(clk)
	c, err := newClients(cfg, append([]transport.WrapperFunc{apiClk.Wrap}, wrappers...)...)
	if err != nil {
		return nil, err
	}
	c.clock, c.apiClock = clk, apiClk
	return c, nil
}

// newClients makes the clients of cfg, with wrappers around its transport.
func newClients(cfg *rest.Config, wrappers ...transport.WrapperFunc) (*clients, error) {
	for _, w := range wrappers {
		cfg.Wrap(w)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating clientset: %w", err)
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating metadata client: %w", err)
	}
	// Custom resources have no protobuf encoding: JSON for podjanitor.io.
	pjCfg := rest.CopyConfig(cfg)
	pjCfg.ContentType, pjCfg.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	pj, err := versioned.NewForConfig(pjCfg)
	if err != nil {
		return nil, fmt.Errorf("creating podjanitor.io clientset: %w", err)
	}
	informerKube, err := leanPodsClient(cfg, kube)
	if err != nil {
		return nil, err
	}
	probe, err := apiclock.NewProbe(cfg)
	if err != nil {
		return nil, err
	}
	return &clients{config: cfg, kube: kube, informerKube: informerKube, metadata: meta, podjanitor: pj, probeClock: probe}, nil
}

// leanPodsClient is kube with a CoreV1 client that decodes pods with
// podcache.LeanDecoding, sharing kube's connection and rate limiter: the pod
// informer's watch then decodes only what its transform keeps.
func leanPodsClient(cfg *rest.Config, kube *kubernetes.Clientset) (kubernetes.Interface, error) {
	core, ok := kube.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok {
		return kube, nil
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion, c.APIPath = &corev1.SchemeGroupVersion, "/api"
	c.NegotiatedSerializer = podcache.LeanDecoding(rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion())
	c.RateLimiter = core.GetRateLimiter()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientForConfigAndClient(c, core.Client)
	if err != nil {
		return nil, fmt.Errorf("creating the pod informer's client: %w", err)
	}
	return leanPods{Interface: kube, core: corev1client.New(rc)}, nil
}

// leanPods is a clientset whose CoreV1 is the lean one.
type leanPods struct {
	kubernetes.Interface
	core corev1client.CoreV1Interface
}

func (c leanPods) CoreV1() corev1client.CoreV1Interface { return c.core }

func restConfig(flags clusterFlags) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if flags.kubeconfig != "" {
		rules.ExplicitPath = flags.kubeconfig
	}
	if flags.kubeconfig == "" && os.Getenv("KUBECONFIG") == "" && flags.master == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return withLimits(cfg, flags), nil
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: flags.master}}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("building client configuration: %w", err)
	}
	return withLimits(cfg, flags), nil
}

func withLimits(cfg *rest.Config, flags clusterFlags) *rest.Config {
	cfg.QPS = float32(flags.kubeAPIQPS)
	cfg.Burst = flags.kubeAPIBurst
	// Protobuf, as Kubernetes' own controllers use: decoding the pod list and
	// watch costs a fraction of JSON's CPU and garbage. Every type podjanitor
	// reads or writes (pods, evictions, events, leases) supports it.
	cfg.ContentType = flags.kubeAPIContentType
	if flags.kubeAPIContentType == runtime.ContentTypeProtobuf {
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	// No gzip unless asked for: the API server compresses a watch that began
	// as a streaming list (WatchListCompression) for its whole life, so every
	// pod event would cost it a gzip stream of its own, on the CPU that serves
	// the removals. A kubeconfig's disable-compression: true still holds.
	if !flags.kubeAPICompression {
		cfg.DisableCompression = true
	}
	cfg.UserAgent = "podjanitor/" + version
	return cfg
}

// loadEvaluator is the evaluator of the flags: the annotations under prefix
// (--annotation-prefix) and the policy file configFile (--config), if any;
// and the file's content that it read once and made the evaluator of (nil
// without a file): the policy watcher compares with these bytes.
func loadEvaluator(configFile, prefix string) (*policy.Evaluator, []byte, error) {
	if configFile == "" {
		return &policy.Evaluator{Prefix: prefix}, nil, nil
	}
	data, err := os.ReadFile(configFile)
	if err != nil {
		return nil, nil, err
	}
	e, err := policyEvaluator(prefix)(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", configFile, err)
	}
	return e, data, nil
}

// policyEvaluator returns the constructor of evaluators from a policy
// file's content, for the annotations under prefix (loadEvaluator's and the
// policy watcher's).
func policyEvaluator(prefix string) func(data []byte) (*policy.Evaluator, error) {
	return func(data []byte) (*policy.Evaluator, error) {
		p, err := policy.Parse(data)
		if err != nil {
			return nil, err
		}
		return &policy.Evaluator{Prefix: prefix, Policy: p}, nil
	}
}

// informerFactory makes the pod informers of --namespace and
// --label-selector, whose cache keeps the lean pods of podcache.PodTransform
// and whose requests' outcomes go to health (nil: none).
func informerFactory(client kubernetes.Interface, scope scopeFlags, health *podWatchHealth) informers.SharedInformerFactory {
	tweak := func(lo *metav1.ListOptions) { lo.LabelSelector = scope.labelSelector }
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(scope.namespace),
		informers.WithTweakListOptions(tweak),
	)
	// The pod informer with the namespace index (a namespace's pods are
	// decided again when its tenant policies or labels change: Controller.
	// enqueueNamespace) and a transform that reads its own store
	// (podcache.RememberingPodTransform).
	factory.InformerFor(&corev1.Pod{}, func(client kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		informer := newPodInformer(client, scope.namespace, resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}, tweak, health)
		if err := informer.SetTransform(podcache.RememberingPodTransform(scope.annotationPrefix, informer.GetStore())); err != nil {
			panic(err) // cannot happen: the informer has not started
		}
		return informer
	})
	return factory
}

// newNamespaceInformer watches the metadata of namespaces, only of
// --namespace when it is set, keeping their labels and keep annotation. It is
// metadatainformer's informer with every list and watch request reported to
// health (nil: none), which client-go's watch error handler would not all
// see: it is not called for a watch that the reflector retries (a 429, a
// refused connection).
func newNamespaceInformer(client metadata.Interface, scope scopeFlags, health *namespacecontroller.WatchHealth) (cache.SharedIndexInformer, error) {
	resource := client.Resource(corev1.SchemeGroupVersion.WithResource("namespaces"))
	tweak := func(lo *metav1.ListOptions) { lo.FieldSelector = namespaceFieldSelector(scope.namespace) }
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, lo metav1.ListOptions) (runtime.Object, error) {
			tweak(&lo)
			list, err := resource.List(ctx, lo)
			health.Observe(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, lo metav1.ListOptions) (watch.Interface, error) {
			tweak(&lo)
			w, err := resource.Watch(ctx, lo)
			health.Observe(err)
			return w, err
		},
	}
	informer := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
	if err := informer.SetTransform(podcache.NamespaceTransform(keepAnnotationKey(scope.annotationPrefix))); err != nil {
		return nil, fmt.Errorf("namespace informer: %w", err)
	}
	return informer, nil
}

// jobsResource is batch/v1 Jobs, whose metadata tells a Job's CronJob.
var jobsResource = batchv1.SchemeGroupVersion.WithResource("jobs")

// newJobInformer watches the metadata of the Jobs of --namespace, else of
// every namespace, keeping their controller (a CronJob): the rules that
// keep the newest pods of each owner group a CronJob's pods through its
// Jobs. A refused list (RBAC of an earlier release) is logged once, then
// at -v=4: the pods are grouped by their Jobs meanwhile.
func newJobInformer(ctx context.Context, client metadata.Interface, scope scopeFlags) (cache.SharedIndexInformer, error) {
	informer := metadatainformer.NewFilteredMetadataInformer(client, jobsResource, scope.namespace, 0, cache.Indexers{}, nil).Informer()
	if err := informer.SetTransform(jobTransform); err != nil {
		return nil, fmt.Errorf("job informer: %w", err)
	}
	var told atomic.Bool
	if err := informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		v := klog.Level(4)
		if !told.Swap(true) {
			v = 0
		}
		klog.FromContext(ctx).V(int(v)).Info("Cannot watch Jobs: a CronJob's pods are grouped by their Jobs until it can", "err", err)
	}); err != nil {
		return nil, fmt.Errorf("job informer: %w", err)
	}
	return informer, nil
}

// jobTransform keeps a Job's name, namespace, UID, resourceVersion and
// controller.
func jobTransform(obj interface{}) (interface{}, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil // a tombstone: as it is
	}
	lean := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}}
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		lean.OwnerReferences = []metav1.OwnerReference{*ref}
	}
	return lean, nil
}

// namespaceFieldSelector selects namespace (--namespace), else every namespace.
func namespaceFieldSelector(namespace string) string {
	if namespace == "" {
		return ""
	}
	return fields.OneTermEqualSelector("metadata.name", namespace).String()
}

// newTenantInformer watches the tenant policies (PodLifetimePolicy) of
// --namespace, else of every namespace, keeping what conversion and status
// read (tenant.Transform; no rules of a policy larger than maxBytes).
func newTenantInformer(client versioned.Interface, scope scopeFlags, maxBytes int) cache.SharedIndexInformer {
	informer := podjanitorinformers.NewSharedInformerFactoryWithOptions(client, 0, podjanitorinformers.WithNamespace(scope.namespace)).
		Podjanitor().V1alpha1().PodLifetimePolicies().Informer()
	if err := informer.SetTransform(tenant.Transform(maxBytes)); err != nil {
		panic(err) // cannot happen: the informer has not started
	}
	return informer
}

// keepAnnotationKey is the keep annotation under prefix (--annotation-prefix).
func keepAnnotationKey(prefix string) string {
	return (&policy.Evaluator{Prefix: prefix}).AnnotationKey(policy.AnnotationKeep)
}
