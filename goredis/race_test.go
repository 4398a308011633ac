//go:build race

package goredis_test

// raceEnabled: this test binary was built with -race.
const raceEnabled = true
