package wave

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// KeyHeldNamespaces records in the record ConfigMap the held changes of
// namespaces' labels or keep annotation (Holds of SourceNamespace), so that
// a restart or a new leader holds them again instead of acting on the
// changed labels: JSON, by namespace, each held change's ID, its wave's size
// and what the namespace was before it (ScopeHold). AnnotationHeldNamespaces
// is where an earlier podjanitor recorded them, on the Lease: read when the
// ConfigMap has no KeyHeldNamespaces yet.
const (
	KeyHeldNamespaces        = "held-namespaces.json"
	AnnotationHeldNamespaces = "podjanitor.io/held-namespaces"
)

// maxHeldScopes is the most KeyHeldNamespaces takes (see maxBaseline).
const maxHeldScopes = 64 << 10

// ErrBadRecord is a record that does not parse: reading it again cannot
// help.
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

// HeldScopes is the held changes of namespaces s records: none when it
// records none. A record that does not parse is an error (ErrBadRecord):
// its holds cannot be told, and acting on the changes they held back could
// remove what a person was to approve first.
func (s Stored) HeldScopes() (map[string]ScopeHold, error) {
	v, ok := s.value(KeyHeldNamespaces, AnnotationHeldNamespaces)
	if !ok || v == "" {
		return nil, nil
	}
	var held map[string]ScopeHold
	if err := json.Unmarshal([]byte(v), &held); err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %s: %w (delete it to release every held namespace change): %w",
			s.namespace(), s.configMapName(), KeyHeldNamespaces, ErrBadRecord, err)
	}
	return held, nil
}

func (s Stored) namespace() string {
	if s.Lease != nil {
		return s.Lease.Namespace
	}
	if s.ConfigMap != nil {
		return s.ConfigMap.Namespace
	}
	return ""
}

func (s Stored) configMapName() string {
	if s.ConfigMap != nil {
		return s.ConfigMap.Name
	}
	if s.Lease != nil {
		return RecordName(s.Lease.Name)
	}
	return ""
}

// PublishScopes records held (none: an empty record) in the record
// ConfigMap, and then takes the legacy annotation of an earlier podjanitor
// off the Lease. A record larger than maxHeldScopes keeps the namespaces
// that fit, by name; it returns those left out, which a restart does not
// hold again.
func (r Record) PublishScopes(ctx context.Context, held map[string]ScopeHold) (left []string, err error) {
	value, left := encodeScopes(held)
	if err := r.updateData(ctx, map[string]string{KeyHeldNamespaces: cmp.Or(value, "{}")}, KeyHeldNamespaces); err != nil {
		return left, fmt.Errorf("recording the held namespace changes in configmap %s/%s: %w", r.Namespace, RecordName(r.Name), err)
	}
	return left, r.dropLegacy(ctx, AnnotationHeldNamespaces)
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
