package main

import (
	"fmt"
	"strconv"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/features"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/clientfeatures"
)

// The oldest API server minors (1.x) that parts of podjanitor need; README's
// "Supported Kubernetes versions" says why.
const (
	// The PodLifetimePolicy CRD's CEL rules call transformList, which a new
	// rule may use from 1.33 (in the CEL environment of 1.32, stored rules only).
	tenantPoliciesMinMinor = 33
	// kube-apiserver's WatchList gate: on by default from 1.34 (on in 1.32,
	// off again in 1.33).
	watchListMinMinor = 34
)

// checkAPIServer reads the API server's version at start and says in one line
// each part of podjanitor that it is too old for: streaming lists are turned
// off (the informers list instead); tenant policies, asked for with
// --tenant-policies, are an error. A version it cannot read or parse is
// logged and taken to have every part.
func checkAPIServer(logger klog.Logger, disco discovery.ServerVersionInterface, tenantPolicies bool) error {
	info, err := disco.ServerVersion()
	if err != nil {
		logger.Error(err, "Reading the API server's version; assuming it has every part podjanitor uses")
		return nil
	}
	minor, ok := apiServerMinor(info.Major, info.Minor, info.GitVersion)
	if !ok {
		logger.Info("Unknown API server version; assuming it has every part podjanitor uses", "version", info.GitVersion)
		return nil
	}
	if tenantPolicies && minor < tenantPoliciesMinMinor {
		return fmt.Errorf("API server %s is older than 1.%d, which tenant policies (--tenant-policies) need: the PodLifetimePolicy CRD's CEL validation rules", info.GitVersion, tenantPoliciesMinMinor)
	}
	if minor < watchListMinMinor && clientfeatures.Off(features.WatchListClient) {
		logger.Info(fmt.Sprintf("API server %s is older than 1.%d, which streaming lists (WatchList) need: the informers list instead", info.GitVersion, watchListMinMinor))
	}
	return nil
}

// apiServerMinor is the 1.x minor of a version.Info's Major and Minor ("1",
// "33+" on some providers), else of its GitVersion; any major above 1 counts
// as newer than every minor.
func apiServerMinor(major, minor, gitVersion string) (int, bool) {
	maj, errMaj := strconv.Atoi(major)
	mnr, errMin := strconv.Atoi(strings.TrimRight(minor, "+"))
	if errMaj != nil || errMin != nil {
		v, err := utilversion.ParseGeneric(gitVersion)
		if err != nil {
			return 0, false
		}
		maj, mnr = int(v.Major()), int(v.Minor())
	}
	switch {
	case maj > 1:
		return int(^uint(0) >> 1), true
	case maj < 1:
		return 0, false
	}
	return mnr, true
}
