DROP TABLE profiles;
