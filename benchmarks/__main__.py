from benchmarks import engine

print(engine.run())
