package engine

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// KeyBase is the start of every key of name: <prefix>{<encoded name>}:.
// All of a name's keys share the hash tag, so they live in one Redis Cluster
// slot and every script touches a single slot. A rate gate's keys go on
// with "rate:", so a gate and a semaphore of one name share a slot but never
// a key.
func KeyBase(prefix, name string) string {
	return prefix + "{" + EncodeName(name) + "}:"
}

// RateBase is the start of every key of the rate gate called name.
func RateBase(prefix, name string) string { return KeyBase(prefix, name) + "rate:" }

// CheckName rejects names that are empty or longer than MaxNameLen bytes.
// Any other byte sequence is a valid name: EncodeName makes it safe.
func CheckName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidName)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: name is %d bytes, the limit is %d", ErrInvalidName, len(name), MaxNameLen)
	}
	return nil
}

// CheckPrefix rejects a key prefix longer than MaxPrefixLen bytes or holding
// a brace (the name's hash tag follows it).
func CheckPrefix(prefix string) error {
	if len(prefix) > MaxPrefixLen || strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("%w: prefix %q must be at most %d bytes without braces", ErrInvalidOption, prefix, MaxPrefixLen)
	}
	return nil
}

// EncodeName maps a name injectively to a string that is safe inside a hash
// tag: ASCII letters, digits and "-_.:/@+=," stand for themselves, every other
// byte (braces, '%', spaces, control bytes, non-ASCII, invalid UTF-8) becomes
// %XX. A brace in a raw name would move or empty the hash tag and scatter the
// name's keys over several cluster slots.
func EncodeName(name string) string {
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

// Printable quotes a name for error messages.
func Printable(name string) string {
	if utf8.ValidString(name) && len(name) <= 64 {
		return name
	}
	if len(name) > 64 {
		name = name[:64] + "..."
	}
	return strings.ToValidUTF8(name, "?")
}

// ValidToken mirrors is_valid in lua/common.lua: tok is "<epoch>:<slot>"
// with slot 1..size written without leading zeros.
func ValidToken(tok, epoch string, size int) bool {
	e, slot, ok := strings.Cut(tok, ":")
	if !ok || e != epoch || slot == "" || slot[0] == '0' {
		return false
	}
	n, err := strconv.Atoi(slot)
	return err == nil && n >= 1 && n <= size && strconv.Itoa(n) == slot
}

// Pairs turns a flat field, value, field, value... reply into a map.
func Pairs(flat []string) map[string]string {
	m := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		m[flat[i]] = flat[i+1]
	}
	return m
}

// DecodeName is the inverse of EncodeName. It accepts only what EncodeName
// writes (safe bytes as themselves, every other byte as %XX with upper-case
// hex), so a decoded name encodes back to the same key.
func DecodeName(enc string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if c != '%' {
			if !safeNameByte(c) {
				return "", false
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(enc) {
			return "", false
		}
		hi, ok1 := upperHex(enc[i+1])
		lo, ok2 := upperHex(enc[i+2])
		if !ok1 || !ok2 || safeNameByte(hi<<4|lo) {
			return "", false
		}
		b.WriteByte(hi<<4 | lo)
		i += 2
	}
	return b.String(), true
}

func upperHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
