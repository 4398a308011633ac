//go:build unix

package main

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redsem/redsem"
)

// durationValue is a flag that takes a Go duration ("1m30s", "250ms") or a
// plain number of seconds ("90", "0.5"), the way flock's -w does. set tells
// whether it was given at all. With max > 0, a value outside min..max is
// refused as the flag's own error.
type durationValue struct {
	d        time.Duration
	set      bool
	min, max time.Duration
}

func (v *durationValue) String() string {
	if v == nil || !v.set {
		return ""
	}
	return v.d.String()
}

func (v *durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	if v.max > 0 && (d < v.min || d > v.max) {
		return fmt.Errorf("not between %s and %s", perText(v.min), perText(v.max))
	}
	v.d, v.set = d, true
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	if secs, err := strconv.ParseFloat(s, 64); err == nil {
		if secs < 0 || secs > float64(redsem.MaxTTL/time.Second) {
			return 0, fmt.Errorf("%q is out of range", s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is neither seconds nor a duration like 1m30s", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	return d, nil
}

// connFlags are the connection flags every subcommand takes.
type connFlags struct {
	url      string
	prefix   string
	cacert   string
	insecure bool
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "redis", "", "")
	fs.StringVar(&c.prefix, "prefix", redsem.DefaultPrefix, "")
	fs.StringVar(&c.cacert, "cacert", "", "")
	fs.BoolVar(&c.insecure, "insecure", false, "")
}

const connHelp = `Connection:
  --redis URL      Redis to use; default $REDIS_URL, else redis://127.0.0.1:6379
                   host:port             the same as redis://host:port
                   redis://[[user]:password@]host[:port][/db]
                   rediss://...          TLS (see --cacert, --insecure)
                   unix:///path/redis.sock[?db=N&password=P]
                   redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master[/db]
                                         the master the sentinels name (port 26379
                                         by default; ?sentinel_password=P for theirs);
                                         rediss+sentinel://... with TLS
  --cacert FILE    PEM file of the CA that signed the server's certificate
  --insecure       TLS without verifying the server's certificate
  --prefix P       key prefix (default "redsem:"); all users of a name must agree
`

// newFlagSet returns a FlagSet that prints nothing by itself: the commands
// print their own help, and errors go through report as one line.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseArgs parses flags wherever they appear among the positional
// arguments and returns the positionals; "--" ends flag parsing, and what
// follows it is positional. See scanArgs for the forms it accepts.
func parseArgs(fs *flag.FlagSet, args []string, help string) ([]string, error) {
	pos, _, err := scanArgs(fs, args, help, -1)
	return pos, err
}

// scanArgs parses args against fs the way GNU getopt and flock(1) users
// expect, with the standard flag package's values:
//
//   - flags may come before, between and after the positionals;
//   - --name value, --name=value, -name value, -name=value; a boolean flag
//     takes no separate value (--json, --json=false);
//   - one-letter flags may be bundled: -nw 5, -nw5, -vn (every letter but the
//     last must be a boolean flag; the last may take the value);
//   - a negative number ("-2") is a positional, not a flag;
//   - -h, -help, --help ask for help.
//
// With stopAfter >= 0, once stopAfter positionals have been read, the next
// positional and everything after it are returned as rest unparsed (the
// command of run), as is everything after a "--". With stopAfter < 0, every
// argument after "--" is a positional and rest is empty.
func scanArgs(fs *flag.FlagSet, args []string, help string, stopAfter int) (pos, rest []string, err error) {
	cmd := fs.Name()
	bad := func(format string, a ...any) error {
		return usagef("%s: %s (see redsem %s --help)", cmd, fmt.Sprintf(format, a...), cmd)
	}
	set := func(f *flag.Flag, shown, value string) error {
		if err := f.Value.Set(value); err != nil {
			return bad("invalid value %q for %s: %v", value, shown, flagError(f, err))
		}
		return nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if stopAfter < 0 {
				return append(pos, args[i+1:]...), nil, nil
			}
			return pos, args[i+1:], nil
		case len(a) < 2 || a[0] != '-' || negativeNumber.MatchString(a):
			if stopAfter >= 0 && len(pos) == stopAfter {
				return pos, args[i:], nil
			}
			pos = append(pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		shown := "-" + name
		if strings.HasPrefix(a, "--") {
			shown = "--" + name
		}
		f := fs.Lookup(name)
		if f == nil && (name == "h" || name == "help") {
			return nil, nil, &helpRequest{text: help}
		}
		if f == nil && !strings.HasPrefix(a, "--") && !hasValue && len(name) > 1 {
			// A bundle of one-letter flags: -nw 5, -nw5.
			consumed, err := setBundle(fs, name, args[i+1:], bad, set)
			if err != nil {
				return nil, nil, err
			}
			i += consumed
			continue
		}
		if f == nil {
			return nil, nil, bad("unknown flag %s", shown)
		}
		if isBool(f) {
			if !hasValue {
				value = "true"
			}
		} else if !hasValue {
			if i+1 == len(args) {
				return nil, nil, bad("flag %s needs a value", shown)
			}
			i++
			value = args[i]
		}
		if err := set(f, shown, value); err != nil {
			return nil, nil, err
		}
	}
	return pos, nil, nil
}

// negativeNumber is an argument that is a value, not a flag: "-2", "-1.5".
var negativeNumber = regexp.MustCompile(`^-[0-9]+(\.[0-9]*)?$`)

// setBundle sets the one-letter flags of the bundle "-" + letters, taking
// the value of the last one, if it needs one, from the rest of the bundle or
// from next. It returns how many arguments of next it used.
func setBundle(fs *flag.FlagSet, letters string, next []string,
	bad func(string, ...any) error, set func(*flag.Flag, string, string) error) (int, error) {
	for j := 0; j < len(letters); j++ {
		shown := "-" + letters[j:j+1]
		f := fs.Lookup(letters[j : j+1])
		if f == nil {
			return 0, bad("unknown flag %s in -%s", shown, letters)
		}
		if isBool(f) {
			if err := set(f, shown, "true"); err != nil {
				return 0, err
			}
			continue
		}
		if j+1 < len(letters) {
			return 0, set(f, shown, letters[j+1:])
		}
		if len(next) == 0 {
			return 0, bad("flag %s needs a value", shown)
		}
		return 1, set(f, shown, next[0])
	}
	return 0, nil
}

// flagError words the flag package's own errors ("parse error", "value out
// of range") for people.
func flagError(f *flag.Flag, err error) string {
	switch err.Error() {
	case "parse error":
		if isBool(f) {
			return "not true or false"
		}
		return "not a whole number"
	case "value out of range":
		return "out of range"
	}
	return err.Error()
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// helpRequest asks main to print text on stdout and exit 0.
type helpRequest struct{ text string }

func (h *helpRequest) Error() string { return "help requested" }

// oneName checks that exactly one NAME was given.
func oneName(cmd string, pos []string) (string, error) {
	switch len(pos) {
	case 0:
		return "", usagef("%s: missing NAME (see redsem %s --help)", cmd, cmd)
	case 1:
		return pos[0], nil
	default:
		return "", usagef("%s: one NAME expected, got %q", cmd, strings.Join(pos, " "))
	}
}
