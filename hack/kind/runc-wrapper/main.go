// Command runc-wrapper is the OCI runtime of the project's dockerd
// (hack/kind/dockerd.sh): it runs runc, after removing from a container's
// capabilities those that this process's bounding set lacks.
//
// Docker gives a --privileged container, as kind's nodes are, every
// capability the kernel knows. Where root itself runs without some (on the
// project's machines CAP_SYS_RESOURCE is not in the bounding set), runc fails
// with "unable to apply caps: operation not permitted" and no kind node
// starts. Such a capability cannot be had anyway; everything else is passed
// through unchanged.
//
// With PODJANITOR_TASK_LOG set (hack/kind/dockerd.sh sets it on its
// containerd, whose shims pass it on), each create or run appends its task's
// "<namespace>/<id>" (the bundle's last two path elements) to that file: the
// names of the shims' sockets in /run/containerd/s, which a SIGKILLed shim
// leaves behind even after containerd has removed the task's bundle.
//
//	dockerd --add-runtime pj-runc=_output/bin/runc-wrapper --default-runtime pj-runc
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// capNames are the capabilities by number (linux/capability.h).
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

func main() {
	runc := os.Getenv("PODJANITOR_RUNC")
	if runc == "" {
		var err error
		if runc, err = exec.LookPath("runc"); err != nil {
			fmt.Fprintln(os.Stderr, "runc-wrapper:", err)
			os.Exit(1)
		}
	}
	if file, inProcess := specOf(os.Args[1:]); file != "" {
		if log := os.Getenv("PODJANITOR_TASK_LOG"); log != "" && inProcess {
			if err := recordTask(log, filepath.Dir(file)); err != nil {
				fmt.Fprintln(os.Stderr, "runc-wrapper: recording the task:", err)
			}
		}
		bounding, err := boundingSet("/proc/self/status")
		if err == nil {
			err = filterFile(file, inProcess, bounding)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "runc-wrapper:", err)
			os.Exit(1)
		}
	}
	err := syscall.Exec(runc, append([]string{runc}, os.Args[1:]...), os.Environ())
	fmt.Fprintln(os.Stderr, "runc-wrapper: exec", runc+":", err)
	os.Exit(1)
}

// specOf returns the file with the capabilities of a runc command: the
// bundle's config.json of create and run (the capabilities under "process"),
// the --process file of exec (at its top), or "" for other commands.
func specOf(args []string) (file string, inProcess bool) {
	cmd := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if cmd == "" {
			switch {
			case a == "create" || a == "run" || a == "exec":
				cmd = a
			case strings.HasPrefix(a, "-") && !strings.Contains(a, "=") && i+1 < len(args) &&
				(a == "--root" || a == "--log" || a == "--log-format" || a == "--criu"):
				i++ // a global flag's value
			}
			continue
		}
		if cmd == "exec" {
			switch {
			case a == "--process" || a == "-p":
				if i+1 < len(args) {
					return args[i+1], false
				}
			case strings.HasPrefix(a, "--process="):
				return strings.TrimPrefix(a, "--process="), false
			}
			continue
		}
		switch {
		case a == "--bundle" || a == "-b":
			if i+1 < len(args) {
				return filepath.Join(args[i+1], "config.json"), true
			}
		case strings.HasPrefix(a, "--bundle="):
			return filepath.Join(strings.TrimPrefix(a, "--bundle="), "config.json"), true
		}
	}
	if cmd == "create" || cmd == "run" {
		// runc's default bundle is the working directory.
		if wd, err := os.Getwd(); err == nil {
			return filepath.Join(wd, "config.json"), true
		}
	}
	// exec without --process takes its capabilities from --cap flags: runc
	// checks those against the container's, already filtered.
	return "", false
}

// recordTask appends "<namespace>/<id>" of a task's bundle
// (.../io.containerd.runtime.v2.task/<namespace>/<id>) to the file log.
func recordTask(log, bundle string) error {
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s/%s\n", filepath.Base(filepath.Dir(bundle)), filepath.Base(bundle))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// boundingSet reads CapBnd of a /proc/PID/status file.
func boundingSet(status string) (uint64, error) {
	f, err := os.Open(status)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "CapBnd:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapBnd in %s", status)
}

// filterFile removes from every capability set of a bundle's config.json
// (inProcess) or of an exec's process file the capabilities absent from
// bounding, and rewrites the file only if one was.
func filterFile(path string, inProcess bool, bounding uint64) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec, process map[string]json.RawMessage
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	process = spec
	if inProcess {
		if p, ok := spec["process"]; !ok || json.Unmarshal(p, &process) != nil {
			return nil
		}
	}
	var caps map[string][]string
	if c, ok := process["capabilities"]; !ok || json.Unmarshal(c, &caps) != nil {
		return nil
	}
	if !filterCaps(caps, bounding) {
		return nil
	}
	if process["capabilities"], err = json.Marshal(caps); err != nil {
		return err
	}
	if inProcess {
		if spec["process"], err = json.Marshal(process); err != nil {
			return err
		}
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

// filterCaps drops, in place, the capabilities not in bounding; unknown names
// are kept. It reports whether it dropped any.
func filterCaps(caps map[string][]string, bounding uint64) bool {
	number := make(map[string]int, len(capNames))
	for i, n := range capNames {
		number[n] = i
	}
	dropped := false
	for set, names := range caps {
		kept := names[:0:0]
		for _, n := range names {
			if i, ok := number[n]; ok && bounding&(1<<uint(i)) == 0 {
				dropped = true
				continue
			}
			kept = append(kept, n)
		}
		caps[set] = kept
	}
	return dropped
}
