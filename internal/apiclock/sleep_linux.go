package apiclock

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// sleepFine waits on a timerfd of the monotonic clock, read through the Go
// runtime's netpoller: the goroutine parks as on any read, the kernel's
// high-resolution timer makes the fd readable, and the netpoller wakes at
// once, whatever millisecond its own wait was rounded to. A system call
// that sleeps (nanosleep) would hold the P meanwhile, and podjanitor runs on
// one. Without a timerfd it falls back to a Go timer.
func sleepFine(d time.Duration) {
	t := timerFDs.take()
	if t == nil {
		time.Sleep(d)
		return
	}
	defer timerFDs.put(t)
	if err := unix.TimerfdSettime(t.fd, 0, &unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}, nil); err != nil {
		time.Sleep(d)
		return
	}
	var expirations [8]byte
	if _, err := t.file.Read(expirations[:]); err != nil {
		time.Sleep(d)
	}
}

// timerFD is a timerfd, with its descriptor kept apart: os.File's Fd would
// make the file blocking, off the netpoller.
type timerFD struct {
	file *os.File
	fd   int
}

// timerFDs are the timerfds not in use: as many as sleeps ran at once
// (two in podjanitor: the parked keys' and the clock's calibration).
var timerFDs timerFDPool

type timerFDPool struct {
	mu     sync.Mutex
	free   []*timerFD
	broken bool // timerfd_create failed: timers only
}

func (p *timerFDPool) take() *timerFD {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.free); n > 0 {
		t := p.free[n-1]
		p.free = p.free[:n-1]
		return t
	}
	if p.broken {
		return nil
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		p.broken = true
		return nil
	}
	return &timerFD{file: os.NewFile(uintptr(fd), "timerfd"), fd: fd}
}

func (p *timerFDPool) put(t *timerFD) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free = append(p.free, t)
}
