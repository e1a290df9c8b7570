package namespacecontroller

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Warnings remembers the invalid keep value each namespace was warned
// about, so that a value that does not parse costs one Warning on the
// Namespace, not one per pod it holds back. An entry lasts until the
// namespace's annotations change or it is deleted.
type Warnings struct {
	mu     sync.Mutex
	warned map[string]string // namespace → the value warned about
}

// WarnOnce says whether the namespace is to be warned about value: the first
// time since its annotations last changed, or a new value.
func (w *Warnings) WarnOnce(namespace, value string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v, ok := w.warned[namespace]; ok && v == value {
		return false
	}
	if w.warned == nil {
		w.warned = map[string]string{}
	}
	w.warned[namespace] = value
	return true
}

// Forget drops what the namespace was warned about (nil m: nothing).
func (w *Warnings) Forget(m metav1.Object) {
	if m == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.warned, m.GetName())
}
