package events

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	clientevents "k8s.io/client-go/tools/events"
)

func TestDrainingSinkWaitsForWritesInFlight(t *testing.T) {
	slow := &slowSink{delay: 300 * time.Millisecond}
	sink := &drainingSink{EventSink: slow}
	go func() { _, _ = sink.Create(context.Background(), &eventsv1.Event{}) }()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	sink.drain(50*time.Millisecond, 5*time.Second)
	if slow.done.Load() != 1 {
		t.Errorf("drain returned after %v with the write still in flight", time.Since(start))
	}
}

type slowSink struct {
	clientevents.EventSink
	delay time.Duration
	done  atomic.Int32
}

func (s *slowSink) Create(context.Context, *eventsv1.Event) (*eventsv1.Event, error) {
	time.Sleep(s.delay)
	s.done.Add(1)
	return nil, nil
}
