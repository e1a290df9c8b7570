package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Values of --logging-format, as Kubernetes components name them.
const (
	loggingText = "text"
	loggingJSON = "json"
)

// newJSONLogger writes one JSON object per line to w, in the shape of
// Kubernetes components' --logging-format=json (k8s.io/component-base/logs/json):
//
//	{"ts":1764437645018.768,"caller":"controller.go:531","msg":"Removed pod","v":2,"pod":{"name":"web-1","namespace":"default"},...}
//
// ts is milliseconds since the epoch; info lines carry their verbosity "v",
// error lines the error "err" instead; the call's keys and values follow.
// Lines above verbosity are dropped.
func newJSONLogger(w io.Writer, verbosity int) logr.Logger {
	var mu sync.Mutex
	return funcr.NewJSON(func(line string) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = io.WriteString(w, line+"\n")
	}, funcr.Options{
		LogCaller:          funcr.All,
		LogInfoLevel:       new("v"),
		Verbosity:          verbosity,
		RenderBuiltinsHook: componentBaseBuiltins(time.Now),
	})
}

// componentBaseBuiltins rewrites funcr's built-in keys (logger, caller, v,
// msg, error) into component-base's: ts first, caller as "file:line", err.
func componentBaseBuiltins(now func() time.Time) func([]any) []any {
	return func(kv []any) []any {
		out := []any{"ts", float64(now().UnixNano()) / float64(time.Millisecond)}
		var rest []any
		for i := 0; i+1 < len(kv); i += 2 {
			switch key, value := kv[i], kv[i+1]; key {
			case "logger":
				if value != "" {
					out = append(out, "logger", value)
				}
			case "caller":
				if c, ok := value.(funcr.Caller); ok {
					value = fmt.Sprintf("%s:%d", c.File, c.Line)
				}
				out = append(out, "caller", value)
			case "error":
				rest = append(rest, "err", value)
			case "msg":
				out = append(out, "msg", value)
			default:
				rest = append(rest, key, value)
			}
		}
		return append(out, rest...)
	}
}
