package wave

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// AnnotationHeldNamespaces records on the Lease the held changes of
// namespaces' labels or keep annotation (Holds of SourceNamespace), so that
// a restart or a new leader holds them again instead of acting on the
// changed labels: JSON, by namespace, each held change's ID, its wave's size
// and what the namespace was before it (ScopeHold).
const AnnotationHeldNamespaces = "podjanitor.io/held-namespaces"

// maxHeldScopes is the most AnnotationHeldNamespaces takes: with the
// baseline (maxBaseline) it stays within the 256 KiB of annotations the API
// server stores per object.
const maxHeldScopes = 64 << 10

// ErrBadRecord is a record on the Lease that does not parse: reading it
// again cannot help.
var ErrBadRecord = errors.New("the record does not parse")

// ScopeHold is one scope's held change as recorded: its ID, its wave's size
// when it came, and the scope's state it holds back to (its baseline, the
// bytes a Holds.Change was given as old).
type ScopeHold struct {
	Change string          `json:"change"`
	Pods   int             `json:"pods"`
	Before json.RawMessage `json:"before"`
}

// Snapshot returns every held change by scope, as a record to publish.
func (h *Holds) Snapshot() map[string]ScopeHold {
	h.mu.Lock()
	scopes := maps.Clone(h.scopes)
	h.mu.Unlock()
	out := map[string]ScopeHold{}
	for name, s := range scopes {
		if hold, ok := s.guard.Held(); ok && json.Valid(s.guard.BaselinePolicy()) {
			out[name] = ScopeHold{Change: hold.ID, Pods: hold.Pods, Before: s.guard.BaselinePolicy()}
		}
	}
	return out
}

// HeldScopesOn is the held changes of namespaces the Lease l (nil: none)
// records: none when the annotation is not there. A record that does not
// parse is an error (ErrBadRecord): its holds cannot be told, and acting on
// the changes they held back could remove what a person was to approve
// first.
func HeldScopesOn(l *coordinationv1.Lease) (map[string]ScopeHold, error) {
	if l == nil {
		return nil, nil
	}
	v, ok := l.Annotations[AnnotationHeldNamespaces]
	if !ok {
		return nil, nil
	}
	var held map[string]ScopeHold
	if err := json.Unmarshal([]byte(v), &held); err != nil {
		return nil, fmt.Errorf("lease %s/%s: annotation %s: %w (remove it to release every held namespace change): %w",
			l.Namespace, l.Name, AnnotationHeldNamespaces, ErrBadRecord, err)
	}
	return held, nil
}

// PublishScopes records held (none: the annotation removed) on the Lease.
// A record larger than maxHeldScopes keeps the namespaces that fit, by
// name; it returns those left out, which a restart does not hold again.
func (r Record) PublishScopes(ctx context.Context, held map[string]ScopeHold) (left []string, err error) {
	value, left := encodeScopes(held)
	err = r.update(ctx, func(l *coordinationv1.Lease) bool {
		old, had := l.Annotations[AnnotationHeldNamespaces]
		switch {
		case value == "" && !had, value != "" && had && old == value:
			return false
		case value == "":
			delete(l.Annotations, AnnotationHeldNamespaces)
		default:
			if l.Annotations == nil {
				l.Annotations = map[string]string{}
			}
			l.Annotations[AnnotationHeldNamespaces] = value
		}
		return true
	})
	if err != nil {
		return left, fmt.Errorf("recording the held namespace changes on lease %s/%s: %w", r.Namespace, r.Name, err)
	}
	return left, nil
}

// encodeScopes is the annotation's value for held ("" for none), with the
// scopes, by name, that fit in maxHeldScopes; left are the others.
func encodeScopes(held map[string]ScopeHold) (value string, left []string) {
	names := slices.Sorted(maps.Keys(held))
	fit := map[string]ScopeHold{}
	size := 2 // {}
	for _, name := range names {
		entry, err := json.Marshal(map[string]ScopeHold{name: held[name]})
		if err != nil || size+len(entry)-1 > maxHeldScopes { // less one brace, plus a comma
			left = append(left, name)
			continue
		}
		size += len(entry) - 1
		fit[name] = held[name]
	}
	if len(fit) == 0 {
		return "", left
	}
	b, err := json.Marshal(fit)
	if err != nil {
		return "", names
	}
	return string(b), left
}
