package main

// The docs are held to the code: every relative link in README.md and docs/
// leads somewhere, the commands they show name make targets and flags that
// exist, and the reference tables of docs/operations.md (flags, metrics,
// events) list exactly what podjanitor has.

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// docsPending are link targets another change of the same step writes; each
// must not exist yet, so that its entry is removed the moment it does.
var docsPending = map[string]string{}

const readmeMaxLines = 250

// metricNamesFile lists every metric family podjanitor exports with its type
// (internal/metrics keeps it equal to the registry).
const metricNamesFile = "artifacts/monitoring/testdata/metrics.txt"

// docFiles is README.md and every Markdown file under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{"README.md"}, files...)
}

// benchmarkPages are BENCHMARKS.md and the pages of older runs it links to in
// docs/benchmarks/.
func benchmarkPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/benchmarks/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"BENCHMARKS.md"}, pages...)
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

var (
	fenceRE      = regexp.MustCompile("(?ms)^```[^\n]*\n(.*?)^```")
	inlineCodeRE = regexp.MustCompile("`[^`]+`")
	linkRE       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE    = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
)

// prose is a Markdown text without its code blocks and code spans.
func prose(md string) string {
	md = fenceRE.ReplaceAllString(md, "")
	return inlineCodeRE.ReplaceAllString(md, "")
}

// codeLines are the lines of a Markdown text's code blocks and its code spans
// (a span broken over a line is joined).
func codeLines(md string) []string {
	var lines []string
	for _, m := range fenceRE.FindAllStringSubmatch(md, -1) {
		lines = append(lines, strings.Split(m[1], "\n")...)
	}
	for _, span := range inlineCodeRE.FindAllString(fenceRE.ReplaceAllString(md, ""), -1) {
		lines = append(lines, strings.ReplaceAll(strings.Trim(span, "`"), "\n", " "))
	}
	return lines
}

// anchors are the fragment names GitHub gives a Markdown file's headings.
func anchors(md string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, m := range headingRE.FindAllStringSubmatch(fenceRE.ReplaceAllString(md, ""), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || r > 0x7f && r != '·' && r != '—':
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+string(rune('0'+n))] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocsLinks: every relative link in README.md, docs/, CHANGELOG.md and the
// benchmark pages names a file or directory that exists and, into a Markdown
// file, a heading it has.
func TestDocsLinks(t *testing.T) {
	for target, why := range docsPending {
		if _, err := os.Stat(target); err == nil {
			t.Errorf("%s exists now (%s): remove it from docsPending", target, why)
		}
	}
	files := append(docFiles(t), "CHANGELOG.md")
	for _, file := range append(files, benchmarkPages(t)...) {
		md := readDoc(t, file)
		for _, m := range linkRE.FindAllStringSubmatch(prose(md), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			path, fragment, _ := strings.Cut(link, "#")
			target := file
			if path != "" {
				target = filepath.Join(filepath.Dir(file), path)
			}
			if _, pending := docsPending[filepath.ToSlash(target)]; pending {
				continue
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s: link %q: %v", file, link, err)
				continue
			}
			if fragment != "" && strings.HasSuffix(target, ".md") && !anchors(readDoc(t, target))[fragment] {
				t.Errorf("%s: link %q: %s has no heading #%s", file, link, target, fragment)
			}
		}
	}
}

// TestReadmeIsShort: README.md is the front door; the reference is in docs/.
func TestReadmeIsShort(t *testing.T) {
	if n := strings.Count(readDoc(t, "README.md"), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, want at most %d: move reference material to docs/", n, readmeMaxLines)
	}
}

// repoFiles are the repository's files (build output and .git left out).
func repoFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (path == "_output" || path == ".git") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var goFileRE = regexp.MustCompile("^`([A-Za-z0-9_*]+\\.go)`$")

// TestDocsGoFilesExist: a Go file the docs name by itself (`plan_test.go`,
// `fault_*_test.go`) is a file of this repository.
func TestDocsGoFilesExist(t *testing.T) {
	var bases []string
	for _, f := range repoFiles(t) {
		bases = append(bases, filepath.Base(f))
	}
	for _, file := range docFiles(t) {
		for _, span := range inlineCodeRE.FindAllString(fenceRE.ReplaceAllString(readDoc(t, file), ""), -1) {
			m := goFileRE.FindStringSubmatch(span)
			if m == nil {
				continue
			}
			if !slices.ContainsFunc(bases, func(b string) bool { ok, _ := filepath.Match(m[1], b); return ok }) {
				t.Errorf("%s names %s, which is no file of the repository", file, m[1])
			}
		}
	}
}

var (
	helpOnce        sync.Once
	helpDaemon      map[string]bool
	helpPlan        map[string]bool
	helpErr         error
	helpFlagRE      = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	makeTargetRE    = regexp.MustCompile(`(?m)^([a-z0-9][a-z0-9-]*):`)
	makeCommandRE   = regexp.MustCompile(`(?:^|[\s;(&|])make((?: +[a-z][a-z0-9-]*)+)`)
	podjanitorCmdRE = regexp.MustCompile(`(?:^\s*(?:\$ )?|[;&|(]\s*)(?:_output/bin/)?podjanitor( plan)?((?: +-[^\s,\]]+(?: +[^-\s#][^\s#]*)?)+)`)
	extraArgsRE     = regexp.MustCompile(`extraArgs: \[([^\]]*)\]`)
	scriptRE        = regexp.MustCompile(`\bhack/[A-Za-z0-9_/.-]+\.sh\b`)
)

// podjanitorHelp builds podjanitor and reads the flags of `--help` and
// `plan --help`.
func podjanitorHelp(t *testing.T) (daemon, plan map[string]bool) {
	t.Helper()
	helpOnce.Do(func() {
		dir, err := os.MkdirTemp("", "podjanitor-docs-")
		if err != nil {
			helpErr = err
			return
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "podjanitor")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			helpErr = &buildError{out}
			return
		}
		read := func(args ...string) map[string]bool {
			out, _ := exec.Command(bin, args...).CombinedOutput() // --help exits 0 or 2
			flags := map[string]bool{}
			for _, m := range helpFlagRE.FindAllStringSubmatch(string(out), -1) {
				flags[m[1]] = true
			}
			return flags
		}
		helpDaemon, helpPlan = read("--help"), read("plan", "--help")
	})
	if helpErr != nil {
		t.Fatal(helpErr)
	}
	if len(helpDaemon) < 10 || len(helpPlan) < 5 {
		t.Fatalf("--help lists %d flags and plan --help %d: want the flags", len(helpDaemon), len(helpPlan))
	}
	return helpDaemon, helpPlan
}

type buildError struct{ out []byte }

func (e *buildError) Error() string { return "go build: " + string(e.out) }

// flagName is the name of a command-line flag ("--workers=4" → "workers").
func flagName(arg string) string {
	name, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
	return name
}

// TestDocsCommands: the commands README.md and docs/ show run as written:
// `make X` names targets of the Makefile, hack/ scripts exist, and
// podjanitor's flags (`podjanitor [plan] --flag`, the chart's extraArgs) are
// in its --help.
func TestDocsCommands(t *testing.T) {
	daemon, plan := podjanitorHelp(t)
	targets := map[string]bool{}
	mks, _ := filepath.Glob("hack/*.mk")
	for _, mk := range append([]string{"Makefile"}, mks...) {
		for _, m := range makeTargetRE.FindAllStringSubmatch(readDoc(t, mk), -1) {
			targets[m[1]] = true
		}
	}
	if !targets["run"] || !targets["test"] {
		t.Fatalf("make targets %v: want run and test among them", targets)
	}
	for _, file := range docFiles(t) {
		md := readDoc(t, file)
		for _, line := range codeLines(md) {
			line, _, _ = strings.Cut(line, "# ")
			for _, m := range makeCommandRE.FindAllStringSubmatch(line, -1) {
				for _, target := range strings.Fields(m[1]) {
					if !targets[target] {
						t.Errorf("%s: %q: make has no target %q", file, strings.TrimSpace(line), target)
					}
				}
			}
			for _, script := range scriptRE.FindAllString(line, -1) {
				if _, err := os.Stat(script); err != nil {
					t.Errorf("%s: %q: %v", file, strings.TrimSpace(line), err)
				}
			}
			for _, m := range podjanitorCmdRE.FindAllStringSubmatch(line, -1) {
				known, cmd := daemon, "podjanitor"
				if m[1] != "" {
					known, cmd = plan, "podjanitor plan"
				}
				for _, arg := range strings.Fields(m[2]) {
					if strings.HasPrefix(arg, "-") && !known[flagName(arg)] {
						t.Errorf("%s: %q: %s has no flag %s", file, strings.TrimSpace(line), cmd, arg)
					}
				}
			}
		}
		for _, m := range extraArgsRE.FindAllStringSubmatch(strings.ReplaceAll(md, "\n", " "), -1) {
			for _, arg := range strings.Split(m[1], ",") {
				if arg = strings.TrimSpace(arg); !daemon[flagName(arg)] {
					t.Errorf("%s: extraArgs: podjanitor has no flag %s", file, arg)
				}
			}
		}
	}
}

// sectionTable is the first Markdown table after the heading "## name" of a
// file: its rows' cells, header and separator left out.
func sectionTable(t *testing.T, path, name string) [][]string {
	t.Helper()
	md := readDoc(t, path)
	i := strings.Index(md, "\n## "+name+"\n")
	if i < 0 {
		t.Fatalf("%s has no section %q", path, name)
	}
	var rows [][]string
	sc := bufio.NewScanner(strings.NewReader(md[i+1:]))
	sc.Scan() // the heading
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") || len(rows) > 0 && !strings.HasPrefix(line, "|") {
			break
		}
		if strings.HasPrefix(line, "|") {
			var cells []string
			for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
				cells = append(cells, strings.TrimSpace(c))
			}
			rows = append(rows, cells)
		}
	}
	if len(rows) < 3 {
		t.Fatalf("%s, section %q: no table", path, name)
	}
	return rows[2:]
}

// codeNames are the code spans of a table cell, backticks removed.
func codeNames(cell string) []string {
	var names []string
	for _, s := range inlineCodeRE.FindAllString(cell, -1) {
		names = append(names, strings.Trim(s, "`"))
	}
	return names
}

// TestDocsFlagsTable: the flags table of docs/operations.md lists exactly the
// flags of `podjanitor --help`.
func TestDocsFlagsTable(t *testing.T) {
	daemon, _ := podjanitorHelp(t)
	listed := map[string]bool{}
	for _, row := range sectionTable(t, "docs/operations.md", "Flags") {
		for _, name := range codeNames(row[0]) {
			if !strings.HasPrefix(name, "-") {
				t.Errorf("docs/operations.md, flags table: %q is no flag", name)
				continue
			}
			listed[flagName(name)] = true
			if !daemon[flagName(name)] {
				t.Errorf("docs/operations.md lists %s, which podjanitor --help does not have", name)
			}
		}
	}
	for name := range daemon {
		if !listed[name] {
			t.Errorf("podjanitor --help has -%s, which the flags table of docs/operations.md does not list", name)
		}
	}
}

// TestDocsMetricsTable: the metrics table of docs/operations.md lists every
// metric family podjanitor exports (metricNamesFile, which
// internal/metrics' TestMetricNamesFile keeps equal to the registry), each with its type, and no
// other.
func TestDocsMetricsTable(t *testing.T) {
	exported := map[string]string{} // name → type
	for _, line := range strings.Split(readDoc(t, metricNamesFile), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && !strings.HasPrefix(line, "#") {
			exported[f[0]] = f[1]
		}
	}
	if len(exported) < 20 {
		t.Fatalf("%s lists %d metrics", metricNamesFile, len(exported))
	}
	covered := map[string]bool{}
	for _, row := range sectionTable(t, "docs/operations.md", "Metrics") {
		names := codeNames(row[0])
		var types []string
		if row[1] != "" {
			types = strings.Split(row[1], ", ")
		}
		for i, name := range names {
			matched := false
			for family, typ := range exported {
				if ok, _ := filepath.Match(name, family); !ok {
					continue
				}
				matched, covered[family] = true, true
				want := ""
				switch len(types) {
				case 1:
					want = types[0]
				case len(names):
					want = types[i]
				}
				if want != "" && !strings.Contains(name, "*") && want != typ {
					t.Errorf("docs/operations.md: %s is a %s, podjanitor exports a %s", name, want, typ)
				}
			}
			if !matched {
				t.Errorf("docs/operations.md lists %s, which podjanitor does not export (%s)", name, metricNamesFile)
			}
		}
	}
	for family := range exported {
		if !covered[family] {
			t.Errorf("podjanitor exports %s, which the metrics table of docs/operations.md does not list", family)
		}
	}
}

var reasonConstRE = regexp.MustCompile(`(?m)^\s*Reason[A-Za-z]+\s*=\s*"([A-Z][A-Za-z]+)"`) // CamelCase: event reasons, not the policy's

// TestDocsEventsTable: the events table of docs/operations.md names exactly
// the event reasons podjanitor's code defines (Reason... constants).
func TestDocsEventsTable(t *testing.T) {
	defined := map[string]bool{}
	for _, f := range repoFiles(t) {
		if !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") ||
			strings.HasPrefix(f, "test"+string(filepath.Separator)) || strings.HasPrefix(f, "hack"+string(filepath.Separator)) {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, []byte("Reason")) {
			continue
		}
		for _, m := range reasonConstRE.FindAllSubmatch(data, -1) {
			defined[string(m[1])] = true
		}
	}
	if len(defined) < 3 {
		t.Fatalf("event reasons in the code: %v", defined)
	}
	listed := map[string]bool{}
	for _, row := range sectionTable(t, "docs/operations.md", "Events") {
		for _, reason := range codeNames(row[0]) {
			listed[reason] = true
			if !defined[reason] {
				t.Errorf("docs/operations.md lists the event reason %s, which podjanitor does not define", reason)
			}
		}
	}
	for reason := range defined {
		if !listed[reason] {
			t.Errorf("podjanitor defines the event reason %s, which the events table of docs/operations.md does not list", reason)
		}
	}
}

// TestDocsAnnotationTables: README.md shows the annotations table of
// docs/policy.md, and the two copies say the same.
func TestDocsAnnotationTables(t *testing.T) {
	table := func(path string) string {
		md := readDoc(t, path)
		i := strings.Index(md, "| annotation | value | the pod goes at |")
		if i < 0 {
			t.Fatalf("%s has no annotations table", path)
		}
		j := strings.Index(md[i:], "\n\n")
		if j < 0 {
			t.Fatalf("%s: the annotations table does not end", path)
		}
		return md[i : i+j]
	}
	if readme, policy := table("README.md"), table("docs/policy.md"); readme != policy {
		t.Errorf("the annotations tables of README.md and docs/policy.md differ:\n%s\n---\n%s", readme, policy)
	}
}

// benchmarksMaxLine is the longest line BENCHMARKS.md and its pages may have
// outside their code blocks: a table row that long is prose in a cell.
const benchmarksMaxLine = 300

var (
	// figureRE is a figure: a number (digits with thousands commas and a
	// decimal part) that is not part of a word, a version or a commit.
	figureRE = regexp.MustCompile(`(^|[^\w.\-/])[−+\-~≈]?\d[\d,]*(\.\d+)?`)
	// notFigureRE are what a cell may hold besides figures: code spans, link
	// targets, commits (7 hex digits with a letter) and versions.
	notFigureRE = regexp.MustCompile("`[^`]*`|\\]\\([^)]*\\)|\\b[0-9a-f]{7,40}\\b|\\bv\\d+(\\.\\d+)+\\b")
)

// cellFigures counts the figures in a table cell.
func cellFigures(cell string) int {
	n := 0
	for _, f := range notFigureRE.FindAllString(cell, -1) {
		if strings.HasPrefix(f, "`") || strings.HasPrefix(f, "](") || strings.HasPrefix(f, "v") || strings.ContainsAny(f, "abcdef") {
			cell = strings.Replace(cell, f, " ", 1)
		}
	}
	for range figureRE.FindAllString(cell, -1) {
		n++
	}
	return n
}

// TestBenchmarksTables: every table cell of BENCHMARKS.md and of the pages of
// older runs holds at most one figure (with its unit), the label of the row
// (its first cell) aside: runs go in rows, caveats in notes below the table.
// And no line outside a code block is longer than benchmarksMaxLine.
func TestBenchmarksTables(t *testing.T) {
	for _, file := range benchmarkPages(t) {
		inFence := false
		for i, line := range strings.Split(readDoc(t, file), "\n") {
			if strings.HasPrefix(line, "```") {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			if n := len([]rune(line)); n > benchmarksMaxLine {
				t.Errorf("%s:%d: %d characters, want at most %d: %.60s…", file, i+1, n, benchmarksMaxLine, line)
			}
			if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
				continue
			}
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for _, c := range cells[1:] {
				if n := cellFigures(c); n > 1 {
					t.Errorf("%s:%d: a cell with %d figures, want one (split runs into rows, caveats into notes): %q", file, i+1, n, strings.TrimSpace(c))
				}
			}
		}
	}
}

func TestCellFigures(t *testing.T) {
	for cell, want := range map[string]int{
		"**6.1 ms**":                          1,
		"+2.7 ms":                             1,
		"−1.2 ms":                             1,
		"0.020 % of a core":                   1,
		"10,000":                              1,
		"p50":                                 0,
		"ccf331e":                             0,
		"2607ba4":                             0,
		"v0.36.0":                             0,
		"`--kube-api-qps 50`":                 0,
		"[tail](docs/benchmarks/c5cea04.png)": 0,
		"9.1 / 24.6 / 73 ms":                  3,
		"42.7 / 46.5 MiB":                     2,
		"51 vs 52/s: 99 %":                    3,
		"0.59 s / 2.65 s, 37 MiB":             3,
		"11.6–12.2 ms":                        2,
	} {
		if got := cellFigures(cell); got != want {
			t.Errorf("cellFigures(%q) = %d, want %d", cell, got, want)
		}
	}
}
