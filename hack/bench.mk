# Load benchmark targets; see BENCHMARKS.md. Included by the Makefile.
#
#   make bench                      local cluster in _output/bench, default N=10000 (~15 min on 2 cores);
#                                   the steady scenario runs the ideal remover beside podjanitor (a second
#                                   namespace of N pods the driver removes itself at their deadlines;
#                                   BENCH_ARGS=-ideal=false: podjanitor's namespace only, half the load);
#                                   charts (PNG) and their data (JSON) go to _output/bench/ beside the results
#   make bench BENCH_SCENARIOS=evict-backlog,ns-backlog BENCH_CAP_PODS=3000 BENCH_ARGS='-cap-namespaces 1000'
#                                   backlogs at the removal cap, podjanitor at its default flags (cap 50/s)
#                                   beside a raw remover making the same requests under the same cap:
#                                   Running pods on kwok nodes (a third under a PodDisruptionBudget) evicted,
#                                   Pending pods over many namespaces deleted (default 600 pods, 200 namespaces)
#   make bench BENCH_SCENARIOS=fair-backlog BENCH_ARGS='-fair-pods 1500 -fair-quiet 4 -fair-quiet-pods 20 -fair-cap 10'
#                                   the cap shared between namespaces: one namespace's pods an hour overdue,
#                                   then quiet namespaces' pods due while they drain; the quiet pods' lateness
#                                   beside the busy ones' wait (-podjanitor-alt: the same with another build)
#   make bench BENCH_PODS=50000 BENCH_SCENARIOS=idle
#                                   (the local kube-apiserver needs ~7 GB of RAM per 50,000 stored
#                                   pods: BENCH_PODS=150000 filled a 24 GB machine; see BENCHMARKS.md)
#   make bench BENCH_PODS=150000 BENCH_SCENARIOS=idle-standin
#                                   memory and idle cost at N with the pods served by the driver's
#                                   stand-in API server: no cluster, so N is not bounded by its memory
#   make bench BENCH_PODJANITOR=pod podjanitor as a pod of artifacts/deploy on the local cluster's
#                                   real node (root), not as a process
#   make bench BENCH_PODS=1000 BENCH_SCENARIOS=churn,recovery
#                                   memory under churn (BENCH_ARGS='-churn-pods 100000 -churn-live 1000')
#                                   and recovery after a 60 s API server outage (-outage)
#   make bench BENCH_SCENARIOS=peer BENCH_PODS=10000 BENCH_ARGS='-peer-lifetime 10m -peer-interval 2m'
#                                   podjanitor beside the descheduler's PodLifeTime (built first by
#                                   hack/build-descheduler.sh) on the same pods in one run: lateness,
#                                   RSS and CPU of both (not in the default BENCH_SCENARIOS)
#   make bench BENCH_SCENARIOS=kyverno BENCH_PODS=10000
#                                   podjanitor beside Kyverno's cleanup controller (its TTL label; built
#                                   first by hack/build-kyverno.sh, ~5 min once) and the ideal remover,
#                                   the same pods in three namespaces, deadlines over 5 min
#                                   (BENCH_ARGS=-kyverno-window=...): lateness, RSS, CPU, API requests
#                                   of each (not in the default BENCH_SCENARIOS)
#   make bench BENCH_ARGS='-tenant-policies 5'  5 no-op PodLifetimePolicies per namespace, --tenant-policies
#   make bench-kind                 the same driver against a fresh kind cluster (hack/kind/up.sh:
#                                   the stock image with Docker of your own, the offline one
#                                   otherwise; BENCH_SCENARIOS defaults to idle,backlog,ns-backlog,steady,churn:
#                                   no recovery or evict-backlog, which need the local cluster); the pods are
#                                   never scheduled, so N is not bounded by the node's max-pods;
#                                   BENCH_KEEP_CLUSTER=1 keeps the cluster

BENCH_PODS         ?= 10000
BENCH_BACKLOG_PODS ?= 3000
BENCH_CAP_PODS     ?= 600
BENCH_SCENARIOS    ?= idle,backlog,evict-backlog,ns-backlog,steady,churn,recovery
BENCH_RUNS         ?= 3
BENCH_WINDOWS      ?= 5m,1m
BENCH_WORKERS      ?= 16
BENCH_QPS          ?= 1000
BENCH_BURST        ?= 1000
BENCH_IDLE         ?= 60s
BENCH_PORT_BASE    ?= 29400
BENCH_PODJANITOR   ?= process
BENCH_KIND_CLUSTER ?= podjanitor-bench

BENCH_ENV = BENCH_PODS=$(BENCH_PODS) BENCH_BACKLOG_PODS=$(BENCH_BACKLOG_PODS) BENCH_CAP_PODS=$(BENCH_CAP_PODS) \
	BENCH_SCENARIOS=$(BENCH_SCENARIOS) BENCH_RUNS=$(BENCH_RUNS) BENCH_WINDOWS=$(BENCH_WINDOWS) \
	BENCH_WORKERS=$(BENCH_WORKERS) BENCH_QPS=$(BENCH_QPS) BENCH_BURST=$(BENCH_BURST) \
	BENCH_IDLE=$(BENCH_IDLE) BENCH_PORT_BASE=$(BENCH_PORT_BASE) BENCH_PODJANITOR=$(BENCH_PODJANITOR)

.PHONY: bench bench-kind

bench: build ## Load benchmark against a local cluster of its own (BENCH_PODS, BENCH_SCENARIOS, BENCH_RUNS, ...).
	$(BENCH_ENV) hack/bench.sh

# bench-kind's scenarios: BENCH_SCENARIOS when given, else the defaults less
# recovery (it needs a local cluster's API server to stop) and evict-backlog
# (it needs the local cluster's kwok nodes).
BENCH_KIND_DEFAULT_SCENARIOS := idle,backlog,ns-backlog,steady,churn
BENCH_KIND_SCENARIOS = $(if $(filter command line environment,$(origin BENCH_SCENARIOS)),$(BENCH_SCENARIOS),$(BENCH_KIND_DEFAULT_SCENARIOS))

bench-kind: build ## Load benchmark against a fresh kind cluster (hack/kind/bench.sh). See BENCHMARKS.md.
	$(BENCH_ENV) BENCH_SCENARIOS=$(BENCH_KIND_SCENARIOS) BENCH_KIND_CLUSTER=$(BENCH_KIND_CLUSTER) \
	  BENCH_KEEP_CLUSTER=$(BENCH_KEEP_CLUSTER) hack/kind/bench.sh
