// Command mutate is redsem's mutation test. It changes one operator of a
// Lua script (internal/engine/lua) or of the Go of the acquisition and
// lease paths, rebuilds, and runs a kill subset of the tests (run.go); a
// mutant no test notices survives. Each mutant has a stable id,
// file:line:col:operator, and a seed picks a sample. survivors.txt lists
// the survivors seen, each equivalent (why) or killed since (by which
// test); docs/explorer.md ("Mutation score") keeps the score. Run it from
// the module's root:
//
//	go run ./internal/mutate -n 300 -seed 1    # a sample of Lua mutants, scored
//	go run ./internal/mutate -lang go -n 60    # of Go mutants
//	go run ./internal/mutate -list             # the ids, nothing run
//	go run ./internal/mutate -ids ID,ID        # these mutants
//	go run ./internal/mutate -print ID         # the file as the mutant makes it
//	go run ./internal/mutate -check -n 6 -seed "$(git rev-parse HEAD)" -budget 90s  # CI
package main

import (
	"bufio"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// A mutant replaces src[Start:End] of File (a path from the module's root).
type mutant struct {
	ID         string
	File       string
	Start, End int
	New        string
}

// goFiles are the Go files of the acquisition and lease paths.
var goFiles = []string{"tokens.go", "lease.go", "weighted.go", "rwmutex.go", "internal/engine/driver.go"}

func main() {
	lang := flag.String("lang", "lua", "mutate the Lua scripts (lua) or the Go of the acquisition and lease paths (go)")
	n := flag.Int("n", 0, "run a sample of this many mutants (0: all)")
	seed := flag.String("seed", "1", "picks the sample: any string (a commit, say)")
	ids := flag.String("ids", "", "run these mutants: ids separated by commas")
	list := flag.Bool("list", false, "print the chosen mutants' ids and run nothing")
	print := flag.String("print", "", "print the file as this mutant (an id) makes it, and run nothing")
	jobs := flag.Int("j", 1, "mutants run at once, each in its own copy of the module")
	check := flag.Bool("check", false, "CI: skip the mutants survivors.txt calls equivalent and the baseline run; fail on any survivor")
	budget := flag.Duration("budget", 0, "start no mutant after this long (0: no limit)")
	verbose := flag.Bool("v", false, "print the tail of a killing test's output")
	flag.Parse()
	if _, err := os.Stat("internal/engine/lua"); err != nil {
		fatalf("run from the module's root: %v", err)
	}
	listed, err := readSurvivors(survivorsFile)
	if err != nil {
		fatalf("%v", err)
	}
	all, err := mutants(*lang)
	if err != nil {
		fatalf("%v", err)
	}
	if *print != "" {
		m := choose(all, *print, 0, "", nil)[0]
		b, err := os.ReadFile(m.File)
		if err != nil {
			fatalf("%v", err)
		}
		fmt.Print(string(b[:m.Start]) + m.New + string(b[m.End:]))
		return
	}
	chosen := choose(all, *ids, *n, *seed, func(id string) bool { return *check && listed[id].verdict == "equivalent" })
	if *list {
		for _, m := range chosen {
			fmt.Println(m.ID)
		}
		return
	}
	fmt.Printf("%d %s mutants, %d chosen (seed %q)\n", len(all), *lang, len(chosen), *seed)
	h := &harness{jobs: *jobs, baseline: !*check, verbose: *verbose}
	if *budget > 0 {
		h.deadline = time.Now().Add(*budget)
	}
	results, err := h.run(chosen)
	if err != nil {
		fatalf("%v", err)
	}
	if !report(results, listed, len(all)) && *check {
		os.Exit(1)
	}
}

// mutants returns every mutant of the language's files, in file order.
func mutants(lang string) ([]mutant, error) {
	files := goFiles
	if lang == "lua" {
		files, _ = filepath.Glob("internal/engine/lua/*.lua")
	} else if lang != "go" {
		return nil, fmt.Errorf("-lang %q: lua or go", lang)
	}
	var all []mutant
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var ms []mutant
		if lang == "lua" {
			ms, err = luaMutants(f, string(b))
		} else {
			ms, err = goMutants(f, string(b))
		}
		if err != nil {
			return nil, err
		}
		all = append(all, ms...)
	}
	return all, nil
}

// choose returns the mutants named by ids, or a sample of n (all when 0)
// drawn with the seed from those skip does not reject.
func choose(all []mutant, ids string, n int, seed string, skip func(string) bool) []mutant {
	if ids != "" {
		byID := map[string]mutant{}
		for _, m := range all {
			byID[m.ID] = m
		}
		var out []mutant
		for _, id := range strings.Split(ids, ",") {
			m, ok := byID[strings.TrimSpace(id)]
			if !ok {
				fatalf("no mutant %q (have the files changed? -list prints the ids)", id)
			}
			out = append(out, m)
		}
		return out
	}
	var pool []mutant
	for _, m := range all {
		if !skip(m.ID) {
			pool = append(pool, m)
		}
	}
	h := fnv.New64a()
	h.Write([]byte(seed))
	rng := rand.New(rand.NewSource(int64(h.Sum64())))
	rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	if n > 0 && n < len(pool) {
		pool = pool[:n]
	}
	return pool
}

// survivorsFile lists every survivor seen: "id equivalent why" or
// "id killed TestName" (a test added since kills it); # starts a comment.
const survivorsFile = "internal/mutate/survivors.txt"

type listing struct{ verdict, why string }

func readSurvivors(path string) (map[string]listing, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]listing{}
	sc := bufio.NewScanner(f)
	for ln := 1; sc.Scan(); ln++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) < 3 || fs[1] != "equivalent" && fs[1] != "killed" {
			return nil, fmt.Errorf("%s:%d: want \"id equivalent why\" or \"id killed TestName\"", path, ln)
		}
		out[fs[0]] = listing{fs[1], strings.Join(fs[2:], " ")}
	}
	return out, sc.Err()
}

// report prints the summary and the score, and reports whether every
// survivor is listed as equivalent.
func report(rs []result, listed map[string]listing, total int) bool {
	count := map[string]int{}
	var equivalent, timeouts int
	var unlisted []string
	for _, r := range rs {
		count[r.status]++
		if r.status == "timeout" {
			timeouts++
		}
		if r.status == "survived" {
			if listed[r.m.ID].verdict == "equivalent" {
				equivalent++
			} else {
				unlisted = append(unlisted, r.m.ID)
			}
		}
	}
	killed := count["killed"] + timeouts
	fmt.Printf("\n%d run of %d: %d killed (%d of them by a timeout), %d survived (%d listed equivalent), %d invalid, %d not run (budget)\n",
		len(rs)-count["unfinished"], total, killed, timeouts, count["survived"], equivalent, count["invalid"], count["unfinished"])
	if scored := killed + count["survived"] - equivalent; scored > 0 {
		p := float64(killed) / float64(scored)
		fmt.Printf("score: %d/%d = %.1f%% of the non-equivalent mutants killed", killed, scored, 100*p)
		if len(rs) < total {
			fmt.Printf(" (sample: ±%.1f%%, 95%%)", 196*math.Sqrt(p*(1-p)/float64(scored)))
		}
		fmt.Println()
	}
	sort.Strings(unlisted)
	for _, id := range unlisted {
		fmt.Printf("SURVIVOR not listed as equivalent in %s: %s\n", survivorsFile, id)
	}
	return len(unlisted) == 0
}

func fatalf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "mutate: "+format+"\n", args...)
	os.Exit(2)
}
