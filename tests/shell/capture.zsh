# What zsh's completion system offers for a command line, as the user's Tab would: an
# interactive zsh in a pseudo-terminal, with compinit and the completion function found in
# the directory $2, is sent the line $1 and a Tab. `compadd` is wrapped to print each
# candidate it is given as <<candidate>>; the shell exits once the completion is done.
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PROMPT=''; fpath=($2 \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z "compadd () { local -a __hits; builtin compadd -O __hits \"\$@\"; print -rl -- '<<'\${^__hits}'>>'; builtin compadd \"\$@\" }"
zpty -w z "comppostfuncs=(exit)"
zpty -w z "bindkey '^I' complete-word"
zpty -w z "$1"$'\t'
local line out=""
while zpty -r z line; do out+="$line"; done
# The echo of the wrapper's own definition holds `<<'${^__hits}'>>`: not a candidate.
print -r -- "$out" | grep -o '<<[^>$]*>>' | sort -u
