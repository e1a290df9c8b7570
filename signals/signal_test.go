package signals

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestMain doubles as the process under test when SIGNALS_HELPER is set: it
// reports when the handler is installed and when the context is cancelled,
// then blocks.
func TestMain(m *testing.M) {
	if os.Getenv("SIGNALS_HELPER") == "1" {
		ctx := SetupSignalHandler()
		fmt.Println("ready")
		<-ctx.Done()
		fmt.Println("cancelled")
		select {}
	}
	os.Exit(m.Run())
}

func TestFirstSignalCancelsSecondExits(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SIGNALS_HELPER=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-lines:
			if got != want {
				t.Fatalf("helper printed %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("helper did not print %q", want)
		}
	}

	expect("ready")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect("cancelled")
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit code after the second signal = %d (%v), want 1", code, err)
	}
}
