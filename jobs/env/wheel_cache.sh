# shellcheck shell=bash
# Wheel cache shared by the install scripts that build from source (install_horovod.sh,
# install_larcv.sh): a built wheel is kept in a folder named by what it was built
# against, so a reinstall takes seconds. Source it; it defines two functions.
#
# install_cached_wheel PYTHON DIR NAME: install DIR/NAME-*.whl if one is cached there;
#   returns 1 (nothing done) otherwise.
# cache_and_install_wheel PYTHON DIST DIR NAME: copy DIST/NAME-*.whl (just built) into
#   DIR and install it from there.

install_cached_wheel() {
    local python=$1 dir=$2 name=$3
    compgen -G "$dir/$name-*.whl" >/dev/null || return 1
    echo "installing cached $name wheel: $(basename "$dir")"
    "$python" -m pip install --no-deps --force-reinstall "$dir"/"$name"-*.whl
}

cache_and_install_wheel() {
    local python=$1 dist=$2 dir=$3 name=$4
    mkdir -p "$dir"
    cp "$dist"/"$name"-*.whl "$dir/"
    "$python" -m pip install --no-deps --force-reinstall "$dir"/"$name"-*.whl
    echo "$name installed; wheel cached in $dir"
}
