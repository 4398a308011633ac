//go:build linux

package main

import (
	"os"
	"syscall"
	"unsafe"
)

// keysMode makes the terminal f hand each key to the program as it is typed,
// without echo (ICANON and ECHO off; ISIG stays, so Ctrl-C is still a
// signal), and returns what restores it. Not a terminal: nothing changes.
func keysMode(f *os.File) (restore func()) {
	var old syscall.Termios
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&old))); e != 0 {
		return func() {}
	}
	raw := old
	raw.Lflag &^= syscall.ICANON | syscall.ECHO
	raw.Cc[syscall.VMIN], raw.Cc[syscall.VTIME] = 1, 0
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCSETS, uintptr(unsafe.Pointer(&raw))); e != 0 {
		return func() {}
	}
	return func() {
		_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCSETS, uintptr(unsafe.Pointer(&old)))
	}
}
