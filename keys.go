package redsem

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// keys holds the Redis keys of one semaphore. All of them share the hash tag
// {<encoded name>}, so they live in one Redis Cluster slot and every script
// touches a single slot.
type keys struct {
	base    string // <prefix>{<encoded name>}:
	meta    string // hash: size, epoch, fence, rejected, created
	tokens  string // list: free tokens
	leases  string // zset: token -> lease deadline (ms, Redis TIME)
	holders string // hash: t:<token> -> record, a:<acqID> -> token
	waits   string // zset: w:<acqID> pending-list sweep deadline, x:<acqID> tombstones
}

func newKeys(prefix, name string) keys {
	return keysAt(prefix + "{" + encodeName(name) + "}:")
}

// keysAt returns the key set under base; a RateGate's lives under
// base+"rate:".
func keysAt(base string) keys {
	return keys{
		base:    base,
		meta:    base + "meta",
		tokens:  base + "tokens",
		leases:  base + "leases",
		holders: base + "holders",
		waits:   base + "waits",
	}
}

// pend is the list a blocked waiter's BLMOVE moves its token into.
func (k keys) pend(acqID string) string { return k.base + "pend:" + acqID }

// all returns the first n keys in the order the scripts expect them.
func (k keys) all(n int) []interface{} {
	ks := []interface{}{k.meta, k.tokens, k.leases, k.holders, k.waits}
	return ks[:n]
}

// checkName rejects names that are empty or longer than MaxNameLen bytes.
// Any other byte sequence is a valid name: encodeName makes it safe.
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidName)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: name is %d bytes, the limit is %d", ErrInvalidName, len(name), MaxNameLen)
	}
	return nil
}

// encodeName maps a name injectively to a string that is safe inside a hash
// tag: ASCII letters, digits and "-_.:/@+=," stand for themselves, every other
// byte (braces, '%', spaces, control bytes, non-ASCII, invalid UTF-8) becomes
// %XX. A brace in a raw name would move or empty the hash tag and scatter the
// semaphore's keys over several cluster slots.
func encodeName(name string) string {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if safeNameByte(c) {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

func safeNameByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.:/@+=,", c) >= 0
}

// printable quotes a name for error messages.
func printable(name string) string {
	if utf8.ValidString(name) && len(name) <= 64 {
		return name
	}
	if len(name) > 64 {
		name = name[:64] + "..."
	}
	return strings.ToValidUTF8(name, "?")
}
