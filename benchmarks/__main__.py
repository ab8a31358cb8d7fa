from benchmarks import architectures, audit_speed, distributed, engine

print(engine.run())
print()
print(audit_speed.run())
print()
print(architectures.run())
print()
print(distributed.run())
