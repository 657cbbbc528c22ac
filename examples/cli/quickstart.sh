mkdir -p src && echo 'print(6 * 7)' > src/app.py
id=$(tether create --label thread=42 --ttl 30m --memory 1G --cpus 1)
tether exec $id -- python3 -c 'print(6*7)'
tether cp ./src $id:/workspace/src                 # directories recursively
tether exec $id -- ls /workspace/src
tether rm $id
