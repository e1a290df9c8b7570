package main

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/policy"
)

// Retention by count (keepNewest, maxPods): a pod's deadline depends on
// its place among the pods its rule decides. The workers set each pod's
// places (policy.Groups) as they decide it, and a pod that comes, goes or
// moves decides again only the pods it moves across their rule's limit.
// The evaluators of other rules (a change measured against the rules acted
// on) count the namespace's pods instead (policy.BatchRanks).

// newRanks makes the controller's places: c.groups for the running
// evaluator, and a count of a namespace's cached pods at most once a
// second for every other (a change measured, a namespace as it was).
func (c *Controller) newRanks() policy.Ranks {
	c.groups = policy.NewGroups()
	return policy.Counted{Live: c.groups, Running: c.evaluator.Load, Batch: &policy.BatchRanks{
		Pods: c.namespacePods,
		Version: func(namespace string) uint64 {
			return uint64(c.clock.Now().Unix())<<20 + c.groups.Version(namespace)
		},
	}}
}

// withRanks is e placing pods by the controller's places, and knowing the
// Jobs' CronJobs.
func (c *Controller) withRanks(e *policy.Evaluator) *policy.Evaluator {
	if e.Ranks == c.ranks {
		return e
	}
	copied := *e
	copied.Ranks = c.ranks
	if c.jobs != nil {
		copied.Controllers = c.jobController
	}
	return &copied
}

// watchJobs reads the controllers of Jobs from jobs (Options.Jobs): a Job
// that comes, goes or changes its controller once pods have places has its
// namespace's pods placed again (coalesced, as a namespace's change).
func (c *Controller) watchJobs(jobs cache.SharedIndexInformer) error {
	c.jobs = jobs.GetIndexer()
	replace := func(obj interface{}) {
		if c.groups.Empty() {
			return
		}
		if key, err := cache.DeletionHandlingObjectToName(obj); err == nil {
			c.enqueueNamespace(key.Namespace)
		}
	}
	_, err := jobs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: replace,
		UpdateFunc: func(old, cur interface{}) {
			o, ok1 := old.(*metav1.PartialObjectMetadata)
			n, ok2 := cur.(*metav1.PartialObjectMetadata)
			if !ok1 || !ok2 || !equality.Semantic.DeepEqual(metav1.GetControllerOfNoCopy(o), metav1.GetControllerOfNoCopy(n)) {
				replace(cur)
			}
		},
		DeleteFunc: replace,
	})
	return err
}

// jobController is policy.Controllers: the controller of the Job owner
// (its CronJob) as the Job cache has it, nil when the cache has no Job
// of that name and UID.
func (c *Controller) jobController(namespace string, owner *metav1.OwnerReference) *metav1.OwnerReference {
	obj, ok, err := c.jobs.GetByKey(namespace + "/" + owner.Name)
	if err != nil || !ok {
		return nil
	}
	m, isMeta := obj.(*metav1.PartialObjectMetadata)
	if !isMeta || m.UID != owner.UID {
		return nil
	}
	return metav1.GetControllerOfNoCopy(m)
}

// place sets pod's places by e (none when pod is nil: gone) and decides
// again the pods it moves across their rule's limit. Without a rule that
// counts, and no place set, it costs a load.
func (c *Controller) place(key cache.ObjectName, pod *corev1.Pod, e *policy.Evaluator, ns *policy.Namespace) {
	if c.groups.Empty() && (pod == nil || !e.Counts(pod.Namespace)) {
		return
	}
	var members []policy.Member
	if pod != nil {
		members = e.Members(pod, ns, key.String())
	}
	for _, moved := range c.groups.Set(key.Namespace, key.String(), members) {
		name, err := cache.ParseObjectName(moved)
		if err != nil {
			utilruntime.HandleError(err)
			continue
		}
		c.feed.Add(name)
	}
}

// unplace takes the places of a deleted pod away at once, from the pod
// informer's handler: a pod it held out of the newest comes back in
// before a worker could remove it by the gone pod.
func (c *Controller) unplace(obj interface{}) {
	if c.groups.Empty() {
		return
	}
	key, err := cache.DeletionHandlingObjectToName(obj)
	if err != nil {
		return
	}
	c.place(key, nil, nil, nil)
}

// namespacePods are namespace's cached pods.
func (c *Controller) namespacePods(namespace string) []*corev1.Pod {
	objs, err := c.pods.ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		utilruntime.HandleError(err)
		return nil
	}
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, obj := range objs {
		if pod, err := podcache.Pod(obj); err == nil {
			pods = append(pods, pod)
		}
	}
	return pods
}
