package engine

import (
	"fmt"
	"strings"
)

// Reading a script's "-- KEYS:" and "-- ARGV:" header lines: NewScript
// takes from the ARGV line how many arguments With always sends, and the
// tests hold every declaration and its argument type against both.

// ArgHeader is a script's "-- ARGV:" header: the names of its arguments in
// order, how many of them a call must give (the rest are optional, left
// out from the last), and whether any number of values may follow them.
type ArgHeader struct {
	Names    []string
	Required int
	Rest     bool
}

// argHeader reads the "-- ARGV:" header of file, whose source is src: the
// names listed, separated by commas (notes in parentheses dropped), over
// the header line and the indented comment lines that continue it. "none"
// is no argument; "and optionally" before a name makes it and every name
// after it optional; an item starting with "then" says that any number of
// values follow (it and what comes after it are not names).
func argHeader(file, src string) (ArgHeader, error) {
	var h ArgHeader
	var text string
	in := false
	for _, line := range strings.Split(src, "\n") {
		if rest, ok := strings.CutPrefix(line, "-- ARGV:"); ok {
			text, in = rest, true
			continue
		}
		if !in {
			continue
		}
		rest, ok := strings.CutPrefix(line, "--   ")
		if !ok {
			break
		}
		text += " " + rest
	}
	if !in {
		return h, fmt.Errorf("%s has no \"-- ARGV:\" header", file)
	}
	if strings.TrimSpace(text) == "none" {
		return h, nil
	}
	optional := false
	for _, it := range headerNames(text) {
		switch {
		case it == "":
			return ArgHeader{}, fmt.Errorf("%s: an empty name in its \"-- ARGV:\" header", file)
		case strings.HasPrefix(it, "then "):
			h.Rest = true
			return h, nil
		}
		if name, ok := strings.CutPrefix(it, "and optionally "); ok {
			it, optional = name, true
		}
		h.Names = append(h.Names, it)
		if !optional {
			h.Required++
		}
	}
	return h, nil
}

// headerNames splits a header's list at the commas outside parentheses and
// drops the parenthesised notes: "a (x, y), b" is "a", "b". An empty item
// (two commas in a row) is kept, as "".
func headerNames(text string) []string {
	depth, cur := 0, ""
	var items []string
	for _, r := range text + "," {
		switch {
		case r == '(':
			depth++
		case r == ')':
			depth--
		case r == ',' && depth == 0:
			items = append(items, strings.TrimSpace(cur))
			cur = ""
		case depth == 0:
			cur += string(r)
		}
	}
	return items
}
