package policy

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{in: "90m", want: 90 * time.Minute},
		{in: "1h30m", want: 90 * time.Minute},
		{in: "1.5h", want: 90 * time.Minute},
		{in: "2d", want: 48 * time.Hour},
		{in: "1w", want: 7 * 24 * time.Hour},
		{in: "1w2d12h", want: (7*24 + 2*24 + 12) * time.Hour},
		{in: "1.5d", want: 36 * time.Hour},
		{in: "300ms", want: 300 * time.Millisecond},
		{in: "1us", want: time.Microsecond},
		{in: "1µs", want: time.Microsecond},
		{in: "0", want: 0},
		{in: "0s", want: 0},
		{in: "+1h", want: time.Hour},
		{in: "15250w1d23h47m16s854ms775us807ns", want: math.MaxInt64},

		{in: "", wantErr: "empty duration"},
		{in: "-1h", wantErr: "negative duration"},
		{in: "-0", wantErr: "negative duration"},
		{in: "+", wantErr: `no number after "+"`},
		{in: "3x", wantErr: `unknown unit "x"`},
		{in: "1h3y", wantErr: `unknown unit "y"`},
		{in: "1D", wantErr: `unknown unit "D"`},
		{in: "3", wantErr: `missing unit after "3"`},
		{in: "1h30", wantErr: `missing unit after "30"`},
		{in: "h", wantErr: `expected a number at "h"`},
		{in: ".d", wantErr: `expected a number at ".d"`},
		{in: "1 h", wantErr: `unknown unit " h"`},
		{in: "15251w", wantErr: "too large: the maximum is 15250w1d23h47m16s854ms775us807ns"},
		{in: "15250w2d", wantErr: "too large"},
		{in: "99999999999999999999s", wantErr: "too large"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDuration(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("ParseDuration(%q) = %v, %v; want error starting %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{90 * time.Minute, "1h30m"},
		{time.Hour, "1h"},
		{36 * time.Hour, "1d12h"},
		{14 * 24 * time.Hour, "2w"},
		{(7*24+2*24+12)*time.Hour + 30*time.Second, "1w2d12h30s"},
		{1500 * time.Millisecond, "1s500ms"},
		{time.Nanosecond, "1ns"},
		{-time.Hour, "-1h"},
		{math.MinInt64, "-15250w1d23h47m16s854ms775us808ns"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := FormatDuration(tt.in); got != tt.want {
				t.Errorf("FormatDuration(%d) = %q, want %q", int64(tt.in), got, tt.want)
			}
		})
	}
}

func TestParseExpiresAt(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Time
		wantErr string
	}{
		{in: "2026-12-01T10:00:00+01:00", want: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)},
		{in: "2026-12-01T10:00:00Z", want: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)},
		{in: "2026-12-01T10:00:00.5-05:00", want: time.Date(2026, 12, 1, 15, 0, 0, 5e8, time.UTC)},
		{in: "2026-12-01", want: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)},

		{in: "", wantErr: "empty time"},
		{in: "2026-12-01T10:00:00", wantErr: `missing time zone offset (append "Z" for UTC or an offset like "+01:00")`},
		{in: "tomorrow", wantErr: `want RFC 3339 with an offset ("2026-12-01T10:00:00+01:00") or a date ("2026-12-01")`},
		{in: "2026-13-01", wantErr: "want RFC 3339"},
		{in: "2026-12-01 10:00:00Z", wantErr: "want RFC 3339"},
		{in: " 2026-12-01", wantErr: "want RFC 3339"},
		{in: "1970-01-01", want: time.Unix(0, 0)},
		{in: "1970-01-01T01:00:00+01:00", want: time.Unix(0, 0)},
		{in: "1969-12-31T23:59:59Z", wantErr: "before 1970-01-01"},
		{in: "1970-01-01T00:30:00+01:00", wantErr: "before 1970-01-01"},
		{in: "0001-01-01", wantErr: "before 1970-01-01"},
		{in: "0001-01-01T00:00:00Z", wantErr: "before 1970-01-01"},
		{in: "0202-12-01", wantErr: "before 1970-01-01"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseExpiresAt(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
					t.Fatalf("ParseExpiresAt(%q) = %v, %v; want error starting %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !got.Equal(tt.want) {
				t.Fatalf("ParseExpiresAt(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func FuzzParseDuration(f *testing.F) {
	for _, seed := range []string{"90m", "1h30m", "1.5h", "2d", "1w2d12h", "0", "+0", "-1h", "3x", "",
		".5w", "1.000000000000000000001h", "15250w1d23h47m16s854ms775us807ns", "9223372036854775807ns", "1µs"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParseDuration(%q): empty error message", s)
			}
			// Every non-negative Go duration is accepted.
			if goD, goErr := time.ParseDuration(s); goErr == nil && goD >= 0 && !strings.HasPrefix(s, "-") {
				t.Fatalf("ParseDuration(%q) = %v, but time.ParseDuration accepts it as %v", s, err, goD)
			}
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v, negative", s, d)
		}
		if goD, goErr := time.ParseDuration(s); goErr == nil && goD != d {
			t.Fatalf("ParseDuration(%q) = %v, time.ParseDuration says %v", s, d, goD)
		}
		formatted := FormatDuration(d)
		back, err := ParseDuration(formatted)
		if err != nil || back != d {
			t.Fatalf("ParseDuration(FormatDuration(%v)) = ParseDuration(%q) = %v, %v; want %v", d, formatted, back, err, d)
		}
	})
}
