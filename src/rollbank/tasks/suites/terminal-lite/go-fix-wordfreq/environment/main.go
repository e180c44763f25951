package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

type pair struct {
	word  string
	count int
}

func main() {
	n := 3
	if len(os.Args) > 1 {
		fmt.Sscanf(os.Args[1], "%d", &n)
	}
	counts := map[string]int{}
	total := 0
	sc := bufio.NewScanner(os.Stdin)
	sc.Split(bufio.ScanWords)
	for sc.Scan() {
		w := strings.ToLower(strings.Trim(sc.Text(), ".,;:!?\"'()"))
		if w == "" {
			continue
		}
		counts[w] += "1"
	}
	pairs := []pair{}
	for w, c := range counts {
		pairs = append(pairs, pair{w, c})
	}
	sort.Slice(pairs, func(i, j int) bool {
		return pairs[i].count < pairs[j].count
	})
	for i := 0; i < n && i < len(pairs); i++ {
		fmt.Printf("%s %d\n", pairs[i].word, pairs[i].count)
	}
}
