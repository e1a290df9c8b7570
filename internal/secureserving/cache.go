package secureserving

import (
	"crypto/sha256"
	"sync"
	"time"
)

// cacheKey is the SHA-256 of what a cached answer is about (a token, a
// user's request): a cache holds no bytes a caller chose.
type cacheKey [sha256.Size]byte

// entryOverhead is what an entry costs beside its value: the key, the
// expiry and the map's own slot, roughly.
const entryOverhead = 128

// ttlCache is a map whose entries expire, bounded in entries and in bytes
// (entryOverhead plus size of the value for each): each insert drops the
// expired entries, then the entries closest to expiry until the new one fits.
type ttlCache[V any] struct {
	maxEntries, maxBytes int
	size                 func(V) int
	evicted              func() // told of each live entry dropped to make room

	mu      sync.Mutex
	entries map[cacheKey]ttlEntry[V]
	bytes   int
}

type ttlEntry[V any] struct {
	value   V
	expires time.Time
	bytes   int
}

func newTTLCache[V any](maxEntries, maxBytes int, size func(V) int, evicted func()) *ttlCache[V] {
	return &ttlCache[V]{maxEntries: maxEntries, maxBytes: maxBytes, size: size, evicted: evicted,
		entries: map[cacheKey]ttlEntry[V]{}}
}

// get returns the value of key and when it expires, if it has not.
func (c *ttlCache[V]) get(key cacheKey, now time.Time) (V, time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !now.Before(e.expires) {
		var zero V
		return zero, time.Time{}, false
	}
	return e.value, e.expires, true
}

// put stores value under key until expires; a value larger than the whole
// cache is not stored.
func (c *ttlCache[V]) put(key cacheKey, value V, expires, now time.Time) {
	size := entryOverhead + c.size(value)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.remove(key)
	for k, e := range c.entries {
		if !now.Before(e.expires) {
			c.remove(k)
		}
	}
	if size > c.maxBytes {
		return
	}
	for len(c.entries) > 0 && (len(c.entries) >= c.maxEntries || c.bytes+size > c.maxBytes) {
		c.remove(c.soonest())
		if c.evicted != nil {
			c.evicted()
		}
	}
	c.entries[key] = ttlEntry[V]{value: value, expires: expires, bytes: size}
	c.bytes += size
}

func (c *ttlCache[V]) remove(key cacheKey) {
	if e, ok := c.entries[key]; ok {
		c.bytes -= e.bytes
		delete(c.entries, key)
	}
}

// soonest is the key of the entry that expires first.
func (c *ttlCache[V]) soonest() cacheKey {
	var key cacheKey
	var first time.Time
	for k, e := range c.entries {
		if first.IsZero() || e.expires.Before(first) {
			key, first = k, e.expires
		}
	}
	return key
}

// held is the entries and bytes held.
func (c *ttlCache[V]) held() (entries, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}

// flight runs one call per key at a time: callers that come while one runs
// share its answer (single-flight).
type flight[V any] struct {
	mu    sync.Mutex
	calls map[cacheKey]*call[V]
}

type call[V any] struct {
	done  chan struct{}
	value V
	err   error
}

// join returns the call in flight for key and false, or a new one and true:
// then the caller runs it and calls finish.
func (f *flight[V]) join(key cacheKey) (*call[V], bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.calls[key]; ok {
		return c, false
	}
	if f.calls == nil {
		f.calls = map[cacheKey]*call[V]{}
	}
	c := &call[V]{done: make(chan struct{})}
	f.calls[key] = c
	return c, true
}

func (f *flight[V]) finish(key cacheKey, c *call[V], value V, err error) {
	f.mu.Lock()
	delete(f.calls, key)
	f.mu.Unlock()
	c.value, c.err = value, err
	close(c.done)
}
