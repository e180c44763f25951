module wordfreq

go 1.19
