// Package receivers holds example webhook receivers written in Python, Node
// and Java with nothing but each language's standard library (see
// README.md), and the test that starts each of them and checks that it
// verifies what package signer sends. It has no Go API.
package receivers
