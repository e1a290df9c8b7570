package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/podjanitor/podjanitor/policy"
)

// validations are the CEL rules of the schema (its bounds are
// policy.TenantMaxItems and TenantMaxLength), by path ("spec",
// "spec.rules[]" for an item of spec.rules). The CEL rules refuse what
// policy.ParseRules refuses, with its messages: test/e2e/tenantapi_test.go
// runs a generated table through both. The API server reports every rule
// that fails; the loader the first.
var validations = map[string]map[string]any{
	"spec": cel(
		rule(`has(self.rules) && size(self.rules) > 0`, msg("at least one rule is required"), field(".rules")),
	),
	"spec.rules": cel(
		rule(`self.all(i, r, !has(r.name) || r.name == '' || !self.exists(j, o, j < i && has(o.name) && o.name == r.name))`,
			msgExpr(bind("k", `self.transformList(i, r, has(r.name) && r.name != '' && self.exists(j, o, j < i && has(o.name) && o.name == r.name), i)[0]`,
				`'rule ' + strings.quote(self[k].name) + ' (rules[' + `+indexString+` + ']): name: duplicate of rules[' + `+
					strings.ReplaceAll(indexString, "[k]", "[self.transformList(j, o, j < k && has(o.name) && o.name == self[k].name, j)[0]]")+` + ']'`))),
	),
	"spec.rules[]": cel(
		rule(`has(self.name) && self.name != ''`, msg("required"), field(".name")),
		rule(`has(self.clock) && self.clock != ''`, msg(`required, one of `+clockList), field(".clock")),
		rule(`has(self.after)`, msg(`required (use "0s" to remove at once)`), field(".after")),
		rule(`!has(self.groupBy) || has(self.keepNewest)`, msg("only with keepNewest"), field(".groupBy")),
		rule(`!has(self.minRestarts) || self.?clock.orValue('') == 'crashLooping'`,
			msgExpr(`'only allowed with clock "crashLooping", not ' + strings.quote(has(self.clock) ? self.clock : '')`), field(".minRestarts")),
		// A clock applies to some phases only (policy clockPhases).
		rule(`!has(self.match) || !has(self.match.phases) || !(self.?clock.orValue('') in `+clockPhases+`) || `+
			`self.match.phases.all(p, !(p in `+phaseList+`) || p in `+clockPhases+`[self.clock])`,
			msgExpr(bind("k", `self.match.phases.transformList(i, p, p in `+phaseList+` && !(p in `+clockPhases+`[self.clock]), i)[0]`,
				`'match.phases[' + `+indexString+` + ']: clock ' + strings.quote(self.clock) + ' never applies to ' + self.match.phases[k] + ' pods'`))),
	),
	"spec.rules[].name": cel(
		rule(`self == '' || self.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')`,
			msgExpr(`strings.quote(self) + " must start and end with a letter or digit and contain only letters, digits, '-', '_' and '.'"`)),
	),
	"spec.rules[].clock": cel(
		rule(`self == '' || self in `+celList(clocks), msgExpr(`'unknown clock ' + strings.quote(self) + ', want one of `+clockList+`'`)),
	),
	"spec.rules[].after": cel(
		rule(durationError+` == ''`, msgExpr(durationError)),
	),
	"spec.rules[].minRestarts": cel(rule(`self >= 0`, msgExpr(negativeInt+` + ' is negative'`))),
	"spec.rules[].keepNewest": cel(
		rule(`self >= 1`, msg("at least 1 (leave it out to keep no pod by count)")),
		rule(fmt.Sprintf(`self <= %d`, policy.MaxKeepNewest), msg(fmt.Sprintf("at most %d", policy.MaxKeepNewest))),
	),
	"spec.rules[].maxPods": cel(
		rule(`self >= 1`, msg("at least 1 (leave it out to bound no namespace)")),
		rule(fmt.Sprintf(`self <= %d`, policy.MaxMaxPods), msg(fmt.Sprintf("at most %d", policy.MaxMaxPods))),
	),
	// policy.GroupByOwner, or GroupByLabelPrefix and a label key
	// (validation.IsQualifiedName: a name of at most 63 characters, after
	// a DNS subdomain prefix of at most 253 and a slash).
	"spec.rules[].groupBy": cel(
		rule(`self == '' || self == 'owner' || self.startsWith('label:') && `+binds([][2]string{
			{"k", `self.substring(6)`},
			{"slash", `k.lastIndexOf('/')`},
		}, `k.matches('^`+labelKey+`$') && size(k) - slash - 1 <= 63 && slash <= 253`),
			msgExpr(`strings.quote(self) + ' is not "owner" or "label:" and a label key (like "label:app.kubernetes.io/name")'`)),
	),
	"spec.rules[].removalNotice": cel(
		rule(durationError+` == ''`, msgExpr(durationError)),
	),
	"spec.rules[].action": cel(
		rule(`self in ['', 'delete', 'evict']`, msgExpr(`'unknown action ' + strings.quote(self) + ', want "delete" or "evict"'`)),
	),
	"spec.rules[].gracePeriodSeconds": cel(
		rule(`self >= 0`, msgExpr(negativeInt+` + ' is negative'`)),
		rule(`self != 0`, msg("0 would force-delete the pod while its containers may still run; use at least 1, or leave it out for the pod's own grace period")),
	),
	"spec.rules[].match.labelSelector": cel(
		rule(selectorValid, msg(`not a label selector (like "app=web,tier!=db", "env in (a,b)" or "!legacy")`)),
	),
	"spec.rules[].match.ownerKinds.include[]": ownerKind,
	"spec.rules[].match.ownerKinds.exclude[]": ownerKind,

	"spec.rules[].match.priorityClassNames.include[]": priorityClassName,
	"spec.rules[].match.priorityClassNames.exclude[]": priorityClassName,

	"spec.rules[].match.phases[]": cel(
		rule(`self in `+phaseList, msgExpr(`'unknown phase ' + strings.quote(self) + ', want one of `+strings.ReplaceAll(phaseList[1:len(phaseList)-1], "'", `"`)+`'`)),
	),
	"spec.rules[].match.reasons[]": cel(rule(`self != ''`, msg("empty reason"))),
}

// maxRules bounds the rules of one resource.
var maxRules = policy.TenantMaxItems["rules"]

var (
	clocks      = clockStrings()
	clockList   = policy.QuotedClocks()
	phaseList   = `['Pending', 'Running', 'Succeeded', 'Failed', 'Unknown']`
	clockPhases = `{'finished': ['Succeeded', 'Failed'], 'pending': ['Pending'], 'crashLooping': ['Pending', 'Running']}`

	ownerKind = cel(
		rule(`self != '' && !self.matches('[ \t\n/]')`, msgExpr(`strings.quote(self) + ' is not a kind (like "ReplicaSet", or "<none>" for bare pods)'`)),
	)
	priorityClassName = cel(
		rule(`self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')`,
			msgExpr(`strings.quote(self) + " is not a priority class name (lowercase letters, digits, '-' and '.', like \"system-cluster-critical\")"`)),
	)
)

// durationError is policy.ParseDuration's error for self, ” when it parses:
// the admission policy's expressions (charts/podjanitor/templates/_duration.tpl),
// with its variables bound by bind.
var durationError = binds([][2]string{
	{"rest", `self.startsWith('+') ? self.substring(1) : self`},
	{"parsed", `rest.find('^(?:(?:[0-9]+(?:[.][0-9]*)?|[.][0-9]+)(?:ns|us|µs|μs|ms|s|m|h|d|w))*')`},
	// A unit that runs on ("1mx": unit "mx") is not the unit the regexp matched.
	{"good", `size(parsed) < size(rest) && !rest.substring(size(parsed)).matches('^[0-9.]') ? ` +
		`parsed.substring(0, size(parsed) - size(parsed.find('(?:[0-9]+(?:[.][0-9]*)?|[.][0-9]+)[^0-9.]+$'))) : parsed`},
	{"bad", `rest.substring(size(good))`},
	{"units", `{'ns': 1, 'us': 1000, 'µs': 1000, 'μs': 1000, 'ms': 1000000, 's': 1000000000, ` +
		`'m': 60000000000, 'h': 3600000000000, 'd': 86400000000000, 'w': 604800000000000}`},
	// Nanoseconds of each good term, -1 for a term too large on its own.
	{"values", `good.findAll('(?:[0-9]+(?:[.][0-9]*)?|[.][0-9]+)[^0-9.]+').map(t, ` + binds([][2]string{
		{"w", `t.find('^[0-9]*').find('[1-9][0-9]*')`},
		{"unit", `units[t.find('[^0-9.]+$')]`},
		{"frac", `t.find('[.][0-9]+') == '' ? 0 : ` +
			`int(double(t.find('[.][0-9]{1,18}').substring(1)) * (double(unit) / ` + powersOfTen + `[size(t.find('[.][0-9]{1,18}')) - 1]))`},
	}, `size(w) > 19 || size(w) == 19 && w > '9223372036854775807' || `+
		`w != '' && (int(w) > 9223372036854775807 / unit || int(w) * unit > 9223372036854775807 - frac) ? -1 : `+
		`(w == '' ? 0 : int(w) * unit) + frac`) + `)`},
	{"tooLarge", `values.exists(n, n < 0) || ` +
		`values.map(n, n / 4294967296).sum() + values.map(n, n % 4294967296).sum() / 4294967296 >= 2147483648`},
	// The number that starts the first bad term, its digits and its unit.
	{"badNumber", `bad.find('^[0-9]*(?:[.][0-9]*)?')`},
	{"badDigits", `badNumber.find('^[0-9]*').find('[1-9][0-9]*')`},
	{"badUnit", `bad.substring(size(badNumber)).find('^[^0-9.]*')`},
}, `self == '' ? 'empty duration' : `+
	`self.startsWith('-') ? 'negative duration' : `+
	`rest == '0' ? '' : `+
	`rest == '' ? 'no number after ' + strings.quote(self) : `+
	`tooLarge ? 'too large: the maximum is 15250w1d23h47m16s854ms775us807ns' : `+
	`bad == '' ? '' : `+
	`badNumber == '' ? 'expected a number at ' + strings.quote(bad) : `+
	`size(badDigits) > 19 || size(badDigits) == 19 && badDigits > '9223372036854775808' ? 'too large: the maximum is 15250w1d23h47m16s854ms775us807ns' : `+
	`badNumber == '.' ? 'expected a number at ' + strings.quote(bad) : `+
	`badUnit == '' ? 'missing unit after ' + strings.quote(badNumber) + ' (use one of ns, us, ms, s, m, h, d, w)' : `+
	`'unknown unit ' + strings.quote(badUnit)`)

// labelKey is a label key's grammar (the prefix's and the name's
// lengths aside).
const labelKey = `(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:[.][a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?`

// selectorValid is whether self parses with labels.Parse: its grammar
// (k8s.io/apimachinery/pkg/labels: requirements "key", "!key",
// "key=value", "key==value", "key!=value", "key in (a,b)", "key notin (a)",
// "key>1", "key<1", separated by commas, blanks around tokens), label keys
// and values, and the integers of > and <. Its messages are not the loader's.
var selectorValid = func() string {
	const (
		ws    = `[ \t\r\n]*`
		key   = `(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:[.][a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?`
		value = `(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?`
	)
	req := ws + `(?:!` + ws + key + `|` + key + `(?:` +
		ws + `(?:==?|!=)` + ws + value + `|` +
		`[ \t\r\n]+(?:in|notin)` + ws + `[(]` + ws + value + `(?:` + ws + `,` + ws + value + `)*` + ws + `[)]|` +
		ws + `[<>]` + ws + `0*` + int64Pattern + `)?)` + ws
	grammar := `^(?:` + ws + `|` + req + `(?:,` + req + `)*)$`
	const token = `[^ \t\r\n=!(),<>/]`
	return `self.matches(r'` + grammar + `') && ` +
		// Name parts and values at most 63 characters, key prefixes 253.
		`!self.matches(r'` + token + `{64}(?:[ \t\r\n=!(),<>]|$)') && !self.matches(r'` + token + `{254}/')`
}()

// int64Pattern matches the decimal numbers 0 to 9223372036854775807 (without
// leading zeros): up to 18 digits, or 19 no greater than the largest int64.
var int64Pattern = func() string {
	const largest = "9223372036854775807"
	alts := []string{`[0-9]{1,18}`}
	for i := range len(largest) {
		if largest[i] == '0' {
			continue
		}
		alt := largest[:i] + "[0-" + string(largest[i]-1) + "]"
		if rest := len(largest) - i - 1; rest > 0 {
			alt += fmt.Sprintf("[0-9]{%d}", rest)
		}
		alts = append(alts, alt)
	}
	alts = append(alts, largest)
	return "(?:" + strings.Join(alts, "|") + ")"
}()

// bind is body with name bound to init (CEL without cel.bind): a list of
// one element mapped.
func bind(name, init, body string) string {
	return "[" + init + "].map(" + name + ", " + body + ")[0]"
}

// binds binds the names in order, each seeing the ones before it.
func binds(vars [][2]string, body string) string {
	for i := len(vars) - 1; i >= 0; i-- {
		body = bind(vars[i][0], vars[i][1], body)
	}
	return body
}

// negativeInt is the negative int self as a string: CEL's string(int) and
// join() have no size bound in the API server's cost estimate.
var negativeInt = func() string {
	digits := celList(strings.Split("0123456789", ""))
	terms := []string{"'-'"}
	for i := 18; i >= 0; i-- {
		p := "1" + strings.Repeat("0", i)
		terms = append(terms, "(self <= -"+p+" ? "+digits+"[-(self / "+p+" % 10)] : '')")
	}
	return "(" + strings.Join(terms, " + ") + ")"
}()

// powersOfTen are 1e0 to 1e18 as doubles (not double('1e' + string(n)),
// for the same reason).
var powersOfTen = func() string {
	var p []string
	for i := range 19 {
		p = append(p, "1"+strings.Repeat("0", i)+".0")
	}
	return "[" + strings.Join(p, ", ") + "]"
}()

// indexString is the index k of a rule (or phase) as a string, for the
// same reason.
var indexString = func() string {
	var n []string
	for i := range maxRules {
		n = append(n, strconv.Itoa(i))
	}
	return celList(n) + "[k]"
}()

func celList(values []string) string {
	return "['" + strings.Join(values, "', '") + "']"
}

type ruleOpt func(map[string]any)

func rule(expr string, opts ...ruleOpt) map[string]any {
	r := map[string]any{"rule": expr}
	for _, opt := range opts {
		opt(r)
	}
	return r
}

func msg(s string) ruleOpt     { return func(r map[string]any) { r["message"] = s } }
func msgExpr(s string) ruleOpt { return func(r map[string]any) { r["messageExpression"] = s } }
func field(s string) ruleOpt   { return func(r map[string]any) { r["fieldPath"] = s } }

func cel(rules ...map[string]any) map[string]any {
	list := make([]any, len(rules))
	for i, r := range rules {
		list[i] = r
	}
	return map[string]any{"x-kubernetes-validations": list}
}

func merge(ms ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// clockStrings are policy.Clocks as strings.
func clockStrings() []string {
	var out []string
	for _, c := range policy.Clocks() {
		out = append(out, string(c))
	}
	return out
}
