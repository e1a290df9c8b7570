package policy

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// durationUnits are time.ParseDuration's units plus d (24h) and w (7d).
var durationUnits = map[string]uint64{
	"ns": uint64(time.Nanosecond),
	"us": uint64(time.Microsecond),
	"µs": uint64(time.Microsecond), // U+00B5 micro sign
	"μs": uint64(time.Microsecond), // U+03BC Greek mu
	"ms": uint64(time.Millisecond),
	"s":  uint64(time.Second),
	"m":  uint64(time.Minute),
	"h":  uint64(time.Hour),
	"d":  uint64(day),
	"w":  uint64(week),
}

var errDurationTooLarge = fmt.Errorf("too large: the maximum is %s", FormatDuration(math.MaxInt64))

// ParseDuration parses a non-negative duration: time.ParseDuration's form
// ("90m", "1h30m", "1.5h") plus the units d (24h) and w (7d): "2d", "1w2d12h".
// Every non-negative string time.ParseDuration accepts means the same here.
func ParseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("empty duration")
	}
	if s[0] == '-' {
		return 0, errors.New("negative duration")
	}
	rest := strings.TrimPrefix(s, "+")
	if rest == "0" {
		return 0, nil
	}
	if rest == "" {
		return 0, fmt.Errorf("no number after %q", s)
	}
	var total uint64
	for rest != "" {
		var err error
		var n uint64
		n, rest, err = durationTerm(rest)
		if err != nil {
			return 0, err
		}
		total += n
		if total > math.MaxInt64 {
			return 0, errDurationTooLarge
		}
	}
	return time.Duration(total), nil
}

// durationTerm consumes one number+unit term such as "1.5h" from the front of s.
// The arithmetic is time.ParseDuration's, so both agree to the nanosecond.
func durationTerm(s string) (n uint64, rest string, err error) {
	if !(s[0] == '.' || '0' <= s[0] && s[0] <= '9') {
		return 0, "", fmt.Errorf("expected a number at %q", s)
	}
	whole, rest, ok := leadingInt(s)
	if !ok {
		return 0, "", errDurationTooLarge
	}
	hasWhole := len(rest) != len(s)
	var frac uint64
	scale, hasFrac := 1.0, false
	if rest != "" && rest[0] == '.' {
		afterDot := rest[1:]
		frac, scale, rest = leadingFraction(afterDot)
		hasFrac = len(rest) != len(afterDot)
	}
	number := s[:len(s)-len(rest)]
	if !hasWhole && !hasFrac {
		return 0, "", fmt.Errorf("expected a number at %q", s)
	}
	i := 0
	for i < len(rest) && rest[i] != '.' && (rest[i] < '0' || rest[i] > '9') {
		i++
	}
	if i == 0 {
		return 0, "", fmt.Errorf("missing unit after %q (use one of ns, us, ms, s, m, h, d, w)", number)
	}
	unitName := rest[:i]
	unit, ok := durationUnits[unitName]
	if !ok {
		return 0, "", fmt.Errorf("unknown unit %q", unitName)
	}
	if whole > 1<<63/unit {
		return 0, "", errDurationTooLarge
	}
	n = whole * unit
	if frac > 0 {
		n += uint64(float64(frac) * (float64(unit) / scale))
		if n > 1<<63 {
			return 0, "", errDurationTooLarge
		}
	}
	return n, rest[i:], nil
}

// leadingInt consumes leading digits; ok is false on overflow.
func leadingInt(s string) (x uint64, rest string, ok bool) {
	i := 0
	for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
		if x > 1<<63/10 {
			return 0, "", false
		}
		x = x*10 + uint64(s[i]-'0')
		if x > 1<<63 {
			return 0, "", false
		}
	}
	return x, s[i:], true
}

// leadingFraction consumes leading digits after a decimal point; past
// uint64 precision it keeps consuming digits but ignores them.
func leadingFraction(s string) (x uint64, scale float64, rest string) {
	i := 0
	scale = 1
	overflow := false
	for ; i < len(s) && '0' <= s[i] && s[i] <= '9'; i++ {
		if overflow {
			continue
		}
		if x > (1<<63-1)/10 {
			overflow = true
			continue
		}
		y := x*10 + uint64(s[i]-'0')
		if y > 1<<63 {
			overflow = true
			continue
		}
		x = y
		scale *= 10
	}
	return x, scale, s[i:]
}

// FormatDuration writes d in whole units from weeks down to nanoseconds
// ("1w2d12h", "1h30m", "1s500ms"), so that ParseDuration(FormatDuration(d)) == d.
// Zero is "0s".
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	var b strings.Builder
	n := uint64(d)
	if d < 0 {
		b.WriteByte('-')
		n = -n
	}
	for _, u := range []struct {
		name string
		size time.Duration
	}{
		{"w", week}, {"d", day}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second},
		{"ms", time.Millisecond}, {"us", time.Microsecond}, {"ns", time.Nanosecond},
	} {
		if count := n / uint64(u.size); count > 0 {
			b.WriteString(strconv.FormatUint(count, 10))
			b.WriteString(u.name)
			n -= count * uint64(u.size)
		}
	}
	return b.String()
}

const expiresAtDateLayout = "2006-01-02"

// earliestExpiresAt is the earliest instant ParseExpiresAt accepts.
var earliestExpiresAt = time.Unix(0, 0)

// ParseExpiresAt parses an instant: RFC 3339 with an offset
// ("2026-12-01T10:00:00+01:00", "2026-12-01T09:00:00Z") or a date
// ("2026-12-01", midnight UTC). An instant in the past is valid (due at
// once) back to 1970-01-01T00:00:00Z; one before that is refused. No pod
// existed then, so such a value is a typo ("0206-12-01") or a placeholder
// ("0001-01-01", Go's zero time, which would also read as "no deadline").
func ParseExpiresAt(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, errors.New("empty time")
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t, err = time.Parse(expiresAtDateLayout, s)
	}
	if err == nil {
		if t.Before(earliestExpiresAt) {
			return time.Time{}, errors.New("before 1970-01-01: a date in the past is due at once, but not one before any pod existed")
		}
		return t, nil
	}
	if _, err := time.Parse("2006-01-02T15:04:05", s); err == nil {
		return time.Time{}, errors.New(`missing time zone offset (append "Z" for UTC or an offset like "+01:00")`)
	}
	return time.Time{}, errors.New(`want RFC 3339 with an offset ("2026-12-01T10:00:00+01:00") or a date ("2026-12-01")`)
}
