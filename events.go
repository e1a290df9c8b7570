package main

import (
	"context"
	"sync"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/client-go/tools/events"
)

// drainingSink counts the event writes in flight so that shutdown can wait for
// them: the events library writes each event from a goroutine of its own and
// offers no flush.
type drainingSink struct {
	events.EventSink
	mu       sync.Mutex
	inFlight int
	last     time.Time
}

func (s *drainingSink) track() func() {
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.inFlight--
		s.last = time.Now()
		s.mu.Unlock()
	}
}

func (s *drainingSink) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	defer s.track()()
	return s.EventSink.Create(ctx, e)
}

func (s *drainingSink) Update(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	defer s.track()()
	return s.EventSink.Update(ctx, e)
}

func (s *drainingSink) Patch(ctx context.Context, e *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	defer s.track()()
	return s.EventSink.Patch(ctx, e, data)
}

// drain waits until no write has been in flight for quiet (counted from the
// call at the earliest, as queued events start their writes just after), or
// until timeout.
func (s *drainingSink) drain(quiet, timeout time.Duration) {
	start := time.Now()
	deadline := start.Add(timeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		idle := s.inFlight == 0 && time.Since(s.last) >= quiet && time.Since(start) >= quiet
		s.mu.Unlock()
		if idle {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
