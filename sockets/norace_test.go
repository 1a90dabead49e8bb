//go:build !race

package sockets

const raceEnabled = false
