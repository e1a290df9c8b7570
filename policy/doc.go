// Package policy decides when a pod's lifetime is over. It is pure: given a pod
// and the current time, Evaluator.Decide says whether the pod has a deadline,
// when, what set it (an annotation or a rule of the policy file) and how the
// pod is to be removed. It makes no API calls.
//
// Order of decision: mirror pods and terminating pods are out of scope; the
// keep annotation vetoes everything; a pod whose namespace is not known is
// left alone until it is; a pod carrying any deadline annotation is decided by
// its annotations alone (the earliest deadline wins); otherwise the first
// rule whose match and clock apply decides: of the tenant policies of the
// pod's namespace (Evaluator.Tenants, by policy name; never for kube-system
// or the critical priority classes), then of the policy file. A rule that
// keeps a number of pods (keepNewest, maxPods) places the pod in its group
// (Evaluator.Ranks): among the newest it has no deadline. Last, the keep annotation
// of the pod's namespace vetoes whatever deadline was found. A key under the
// prefix that is not one of AnnotationNames makes the pod's annotations
// invalid, as a value that does not parse does.
//
// Times that nodes write (finish times, condition transitions) are bounded by
// the API server's time of the pod's latest status write (fromNode), so a
// node's clock can make a removal late, never early.
//
// Where to read: decision.go holds Evaluator.Decide and the annotations;
// rule.go how a rule of the policy file matches a pod and when its clock
// starts; pod.go the facts of a pod that clocks count from (finish time,
// stuck pending, crash looping); duration.go the durations of annotations
// and rules ("90m", "3d", "1w"); policy.go the policy file's types; and
// validation.go, with decode.go, how a file is parsed and checked, with
// errors that name the rule and the field; tenant.go the tenant policies
// (PodLifetimePolicy) and the cluster admin's restrictions on them; count.go
// retention by count (Groups, kept pod by pod; BatchRanks, counted at once).
package policy
