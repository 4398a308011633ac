//go:build unix

package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redsem/redsem"
)

// durationValue is a flag that takes a Go duration ("1m30s", "250ms") or a
// plain number of seconds ("90", "0.5"), the way flock's -w does. set tells
// whether it was given at all.
type durationValue struct {
	d   time.Duration
	set bool
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
                   redis://[[user]:password@]host[:port][/db]
                   rediss://...          TLS (see --cacert, --insecure)
                   unix:///path/redis.sock[?db=N&password=P]
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
// arguments (flag stops at the first non-flag; this resumes after it) and
// returns the positionals. "--" ends flag parsing for good.
func parseArgs(fs *flag.FlagSet, args []string, help string) ([]string, error) {
	var pos []string
	for {
		if err := parseOnce(fs, args, help); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parseOnce runs fs.Parse and turns -h/--help into a help exit and other
// errors into usage errors.
func parseOnce(fs *flag.FlagSet, args []string, help string) error {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case err == flag.ErrHelp:
		return &helpRequest{text: help}
	default:
		return usagef("%s: %v (see redsem %s --help)", fs.Name(), err, fs.Name())
	}
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
