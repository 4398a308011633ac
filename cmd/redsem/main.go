//go:build unix

// Command redsem is a distributed flock(1) on Redis: it runs a command while
// holding a read-write lock, one of the N slots of a named semaphore, or a
// start of a rate gate; shows, checks, repairs and deletes every kind of
// name; and demonstrates the library with an embedded Redis.
//
//	redsem run [flags] NAME -- COMMAND [ARGS...]
//	redsem elect [flags] NAME -- COMMAND [ARGS...]
//	redsem leader [--json] [--watch] NAME
//	redsem status [--json] NAME
//	redsem reclaim NAME
//	redsem resize [--create] NAME N
//	redsem check [--json] NAME
//	redsem repair NAME
//	redsem delete --force NAME
//	redsem rate set [--create] NAME N/PER...
//	redsem rate status [--json] NAME
//	redsem top [--json] [-n N]
//	redsem check --all [--json]
//	redsem check --server
//	redsem exporter [--listen :9464]
//	redsem demo [--workers W] [--size K] [--work D]
//
// Run "redsem help" or "redsem COMMAND --help" for details; README.md in
// this directory lists the exit codes.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
)

const mainHelp = `redsem: a distributed flock(1) on Redis, with status and a demo.

Usage:
  redsem run [flags] NAME -- COMMAND [ARGS...]   run COMMAND holding the lock NAME (or a slot: --size)
  redsem run --rate N/PER NAME -- COMMAND        run COMMAND once rate gate NAME allows a start
  redsem elect [flags] NAME -- COMMAND [ARGS...] run COMMAND only while leading election NAME
  redsem leader [--json] [--watch] NAME          who leads election NAME; --watch: every change
  redsem status [--json] NAME                    show NAME, whatever its kind
  redsem reclaim NAME                            give back the slots of expired leases
  redsem resize [--create] NAME N                set a semaphore's number of slots for everyone
  redsem check [--json] NAME                     is NAME healthy; exit 65 if not
  redsem repair NAME                             drop stray tokens, mint missing ones safely
  redsem delete --force NAME                     remove every key of NAME
  redsem rate set [--create] NAME N/PER...       change a rate gate's limits for everyone
  redsem rate status [--json] NAME               show a rate gate
  redsem demo [--workers W] [--size K]           watch W workers share K slots (no Redis needed)
  redsem top [--prefix P] [--json]               live view of every semaphore, lock, rate gate, election
  redsem check --all [--prefix P] [--json]       every unhealthy name; exit 65 if any
  redsem check --server                          is Redis fit for redsem (version, maxmemory-policy)
  redsem exporter [--listen :9464]               Prometheus /metrics for every name under --prefix
  redsem help COMMAND                            help for one command
  redsem --version                               print the version

Kinds: a semaphore (a mutex is one of size 1), a read-write lock (what run
NAME takes without --size), a rate gate, an election (elect, leader). Every
command above acts on each kind it applies to, says which kind it found, and
refuses the others.

Redis comes from --redis URL or $REDIS_URL (default redis://127.0.0.1:6379).

Examples:
  redsem demo
  redsem run -n nightly-backup -- /usr/local/bin/backup.sh
  redsem run --size 4 -w 60 encoders -- ffmpeg -i in.mov out.mp4
  redsem status --json encoders
  redsem run --rate 10/1m partner-api -- ./sync.sh

Exit codes: 0 ok; run passes the command's code through; 1 no slot or start
(-n, -w); 64 usage; 65 state in Redis (or an action the kind does not take);
66 no such name; 69 Redis unavailable; 70 internal; 75 lease lost; 126/127
command not runnable/not found; 128+N signal N.
`

// command is one subcommand: its help text and its body.
type command struct {
	help string
	run  func(args []string, stdout, stderr io.Writer) error
}

var commands map[string]command

// commandList names every command, as redsem help lists them.
const commandList = "run, elect, leader, status, reclaim, resize, check, repair, delete, rate, top, exporter, demo, help, version"

func init() {
	commands = map[string]command{
		"run":     {runHelp, cmdRun},
		"elect":   {electHelp, cmdElect},
		"leader":  {leaderHelp, cmdLeader},
		"status":  {statusHelp, cmdStatus},
		"reclaim": {reclaimHelp, cmdReclaim},
		"resize":  {resizeHelp, cmdResize},
		"check":   {checkHelp, cmdCheck},
		"repair":  {repairHelp, cmdRepair},
		"delete":  {deleteHelp, cmdDelete},
		"rate":    {rateHelp, cmdRate},
		"demo":    {demoHelp, cmdDemo},
		// The fleet view (top.go, exporter.go).
		"top":      {topHelp, cmdTop},
		"exporter": {exporterHelp, cmdExporter},
	}
}

func main() {
	defer func() {
		// A bug must still end in one line and a documented code.
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "redsem: internal error: %v\n", r)
			os.Exit(exitSoftware)
		}
	}()
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

// dispatch runs the subcommand args[0] and returns the exit code.
func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return report(stderr, usagef("missing command; commands: %s (see redsem help)", commandList))
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		if len(rest) == 0 {
			fmt.Fprint(stdout, mainHelp)
			return exitOK
		}
		c, ok := commands[rest[0]]
		if !ok {
			return report(stderr, usagef("help: unknown command %q;%s commands: %s", rest[0], didYouMean(rest[0]), commandList))
		}
		fmt.Fprint(stdout, c.help)
		return exitOK
	case "-V", "--version", "-version", "version":
		fmt.Fprintf(stdout, "redsem %s\n", version())
		return exitOK
	case guardCommand:
		return runGuard(rest)
	}
	c, ok := commands[name]
	if !ok {
		return report(stderr, usagef("unknown command %q;%s commands: %s (see redsem help)", name, didYouMean(name), commandList))
	}
	err := c.run(rest, stdout, stderr)
	var h *helpRequest
	if errors.As(err, &h) {
		fmt.Fprint(stdout, h.text)
		return exitOK
	}
	if err == nil {
		return exitOK
	}
	return report(stderr, err)
}

// didYouMean suggests the command closest to a mistyped one (" did you
// mean status?"), or nothing when none is close: at most one edit for a
// name of up to three letters, two for a longer one (a swap of two letters
// is two).
func didYouMean(name string) string {
	best, bestD := "", len(name)
	for _, c := range strings.Split(commandList, ", ") {
		if d := editDistance(name, c); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" || bestD > 2 || bestD > 1 && len(name) < 4 {
		return ""
	}
	return " did you mean " + best + "?"
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// version is the module version redsem was built from ("v0.1.0" when
// installed with go install ...@v0.1.0), or "(devel)" when built from a
// checkout.
func version() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}
