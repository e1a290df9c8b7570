//go:build !linux

package apiclock

import "time"

func sleepFine(d time.Duration) { time.Sleep(d) }
